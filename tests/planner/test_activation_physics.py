"""The activation formula against what autograd really saves in Hugging Face's Llama (+ PEFT).

A tiny Llama is built from a config on the CPU (nothing downloaded); every tensor saved for backward
during the forward is recorded with saved_tensors_hooks and de-duplicated by storage. Two depths are
measured and subtracted, so embeddings, the final norm and the loss cancel and what remains is one
block's saved bytes - the quantity memory.py computes tensor by tensor.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from bot.planner.architectures import from_config  # noqa: E402
from bot.planner.memory import _activation_bytes_per_token_layer  # noqa: E402
from bot.planner.request import EstimateRequest  # noqa: E402

pytestmark = pytest.mark.slow

DIMS = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, vocab_size=512
)
BATCH, SEQ = 2, 128


def saved_bytes(layers: int, method: str, targets, attn: str, autocast: bool) -> int:
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, attn_implementation=attn, **DIMS)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=targets, lora_dropout=0.0))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.nbytes():
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    ids = torch.randint(0, DIMS["vocab_size"], (BATCH, SEQ))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


@pytest.mark.parametrize(
    ("method", "targets", "attn", "autocast"),
    [
        ("full", None, "sdpa", False),
        ("lora", ["q_proj", "v_proj"], "sdpa", True),
        ("lora", "all-linear", "sdpa", True),
        ("lora", "all-linear", "sdpa", False),
        ("lora", ["q_proj", "v_proj"], "eager", True),
    ],
)
def test_one_block_saves_what_the_formula_says(method: str, targets, attn: str, autocast: bool) -> None:
    measured = (
        saved_bytes(4, method, targets, attn, autocast) - saved_bytes(2, method, targets, attn, autocast)
    ) / 2
    arch = from_config({"model_type": "llama", "num_hidden_layers": 4, **DIMS})
    req = EstimateRequest(
        model="tiny",
        method=method,
        lora_r=8,
        lora_targets=targets or "all-linear",
        batch_size=BATCH,
        seq_len=SEQ,
        attn=attn,
        autocast=autocast,
        gradient_checkpointing=False,
    )
    predicted = _activation_bytes_per_token_layer(arch, req) * BATCH * SEQ
    assert predicted == pytest.approx(measured, rel=0.10), (
        f"predicted {predicted:,.0f} B, measured {measured:,.0f} B"
    )
