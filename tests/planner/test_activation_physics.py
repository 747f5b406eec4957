"""The activation formula against what autograd really saves in Hugging Face models (+ PEFT).

Tiny models are built from configs on the CPU (nothing downloaded); every tensor saved for backward
during the forward is recorded with saved_tensors_hooks and de-duplicated by storage. Two depths
(2 and 1 blocks) are measured and subtracted, so embeddings, the final norm and the loss cancel and
what remains is one block's saved bytes - the quantity memory.py computes tensor by tensor.
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
BATCH, SEQ = 2, 64
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 32}),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, {"head_dim": 32}),
    "phi3": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    ),
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        {"num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}


def saved_bytes(layers: int, method: str, targets, attn: str, autocast: bool, family: str = "llama") -> int:
    config_cls, model_cls, extra = FAMILIES[family]
    cfg = config_cls(num_hidden_layers=layers, attn_implementation=attn, **DIMS, **extra)
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.bfloat16)
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
        ("lora", "all-linear", "sdpa", False),
        ("lora", ["q_proj", "v_proj"], "eager", True),
    ],
)
def test_one_block_saves_what_the_formula_says(method: str, targets, attn: str, autocast: bool) -> None:
    measured = saved_bytes(2, method, targets, attn, autocast) - saved_bytes(
        1, method, targets, attn, autocast
    )
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


@pytest.mark.parametrize(
    ("family", "method", "attn"),
    [
        ("qwen2", "full", "sdpa"),
        ("qwen3", "full", "sdpa"),
        ("gemma2", "full", "eager"),
        ("gemma2", "lora", "eager"),
        ("phi3", "lora", "sdpa"),
        ("mixtral", "full", "sdpa"),
        # Mixtral LoRA is left out: recent PEFT adapts the fused 3-D expert tensors with a
        # parameter wrapper whose saved tensors depend on the library version.
    ],
)
def test_architecture_quirks_are_counted(family: str, method: str, attn: str) -> None:
    """Qwen2 biases, Qwen3 q/k norms, Gemma 2's fp32 norms and capped scores, Phi-3's fused projections."""
    lora = method == "lora"
    targets = "all-linear" if lora else None
    measured = saved_bytes(2, method, targets, attn, lora, family) - saved_bytes(
        1, method, targets, attn, lora, family
    )
    config_cls, _, extra = FAMILIES[family]
    cfg = config_cls(num_hidden_layers=4, **DIMS, **extra).to_dict()
    cfg["model_type"] = family
    req = EstimateRequest(
        model="tiny",
        method=method,
        lora_r=8,
        batch_size=BATCH,
        seq_len=SEQ,
        attn=attn,
        autocast=lora,
        gradient_checkpointing=False,
    )
    predicted = _activation_bytes_per_token_layer(from_config(cfg), req) * BATCH * SEQ
    assert predicted == pytest.approx(measured, rel=0.10), (
        f"predicted {predicted:,.0f} B, measured {measured:,.0f} B"
    )


def _qlora_model(layers: int, upcast: bool, tmp_path):
    """A tiny Llama quantized by bitsandbytes (NF4 + double quantization, CPU) as the runner loads it."""
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, attn_implementation="sdpa", **DIMS)
    torch.manual_seed(0)
    folder = tmp_path / f"q{layers}"
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quant, dtype=torch.bfloat16, device_map={"": "cpu"}
    )
    if upcast:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0))


def _saved(model) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.nbytes():
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    ids = torch.randint(0, DIMS["vocab_size"], (BATCH, SEQ))
    # One padded position: a mask, as the runner always has (packing or padding), so SDPA repeats k and v to
    # every head (transformers' use_gqa_in_sdpa: native GQA only without a mask), as the planner counts.
    mask = torch.ones_like(ids)
    mask[0, -1] = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, labels=ids)
    return sum(seen.values())


@pytest.mark.parametrize("upcast", [False, True])
def test_bitsandbytes_qlora_block_and_its_fp32_residual_stream(upcast: bool, tmp_path) -> None:
    """QLoRA as the runner loads it: one block saves what the formula says, and with
    prepare_model_for_kbit_training the residual stream between blocks (what checkpointing keeps) is fp32."""
    pytest.importorskip("bitsandbytes")
    from bot.planner.memory import fp32_residual

    measured = _saved(_qlora_model(2, upcast, tmp_path)) - _saved(_qlora_model(1, upcast, tmp_path))
    arch = from_config({"model_type": "llama", "num_hidden_layers": 4, **DIMS})
    req = EstimateRequest(
        model="tiny",
        method="qlora",
        lora_r=8,
        batch_size=BATCH,
        seq_len=SEQ,
        gradient_checkpointing=False,
        autocast=False,
        qlora_upcast=upcast,
    )
    predicted = _activation_bytes_per_token_layer(arch, req) * BATCH * SEQ
    assert predicted == pytest.approx(measured, rel=0.10), f"{predicted:,.0f} vs measured {measured:,.0f}"

    model = _qlora_model(1, upcast, tmp_path)
    dtypes = []
    layer = model.get_base_model().model.layers[0]
    layer.register_forward_hook(
        lambda _m, _i, out: dtypes.append((out[0] if isinstance(out, tuple) else out).dtype)
    )
    model(input_ids=torch.randint(0, DIMS["vocab_size"], (BATCH, SEQ)))
    assert dtypes == [torch.float32 if upcast else torch.bfloat16]
    assert fp32_residual(req) is upcast
