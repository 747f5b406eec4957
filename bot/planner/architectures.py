"""Model architectures from a Hugging Face config.json, with exact parameter counts.

An Architecture is a list of block groups (decoder layers; T5 has encoder and decoder groups), each a
list of Linear layers plus the block's other parameters (norms, routers), and the global parameters
(embeddings, lm_head when untied, final norms). Counting Linear layers explicitly gives exact totals,
exact LoRA counts for any target set, and the split that bitsandbytes quantizes (Linear layers inside
the blocks only; embeddings, lm_head and norms stay 16-bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from bot.planner.errors import BadRequestError, PlanningError

# Names people and libraries use for the projections (PEFT suffixes, torchtune, Mixtral, Bloom, T5).
ROLE_ALIASES: dict[str, tuple[str, ...]] = {
    "q": ("q",),
    "q_proj": ("q",),
    "query": ("q",),
    "k": ("k",),
    "k_proj": ("k",),
    "key": ("k",),
    "v": ("v",),
    "v_proj": ("v",),
    "value": ("v",),
    "o": ("o",),
    "o_proj": ("o",),
    "output_proj": ("o",),
    "out_proj": ("o",),
    "dense": ("o",),
    "qkv": ("q", "k", "v"),
    "qkv_proj": ("q", "k", "v"),
    "query_key_value": ("q", "k", "v"),
    "gate": ("gate",),
    "gate_proj": ("gate",),
    "w1": ("gate",),
    "up": ("up",),
    "up_proj": ("up",),
    "w3": ("up",),
    "wi": ("up",),
    "dense_h_to_4h": ("up",),
    "gate_up_proj": ("gate", "up"),
    "down": ("down",),
    "down_proj": ("down",),
    "w2": ("down",),
    "wo": ("down",),
    "dense_4h_to_h": ("down",),
    "attn": ("q", "k", "v", "o"),
    "mlp": ("gate", "up", "down"),
    "router": ("router",),
}


@dataclass(frozen=True)
class Linear:
    """One Linear layer of a block; `count` copies (experts), `active` of them used per token."""

    name: str
    d_in: int
    d_out: int
    roles: tuple[str, ...]
    bias: bool = False
    count: int = 1
    active: int = 1

    @property
    def params(self) -> int:
        return self.count * (self.d_in * self.d_out + (self.d_out if self.bias else 0))

    @property
    def active_params(self) -> int:
        return self.active * (self.d_in * self.d_out + (self.d_out if self.bias else 0))

    def lora_params(self, r: int) -> int:
        return self.count * r * (self.d_in + self.d_out)


@dataclass(frozen=True)
class BlockGroup:
    """`layers` identical blocks."""

    layers: int
    linears: tuple[Linear, ...]
    other_params: int  # norms, routers, attention biases that are not Linear layers


@dataclass(frozen=True)
class Adapted:
    """LoRA targets as asked, resolved against one model: the Linear layers they adapt."""

    asked: tuple[str, ...] | str
    linears: tuple[Linear, ...]


def _asked(targets: list[str] | tuple[str, ...] | str) -> tuple[str, ...] | str:
    return targets if isinstance(targets, str) else tuple(targets)


@dataclass(frozen=True)
class Architecture:
    name: str
    model_type: str
    hidden: int
    intermediate: int  # dense MLP width, or per-expert width for mixture-of-experts
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    groups: tuple[BlockGroup, ...]
    embedding_params: int  # input embeddings (+ lm_head when untied) + position embeddings
    global_other_params: int  # final norms, embedding norms
    experts: int = 0
    experts_per_token: int = 0
    active_ffn: int = 0  # MLP width used per token (top-k experts + shared expert)
    gated_mlp: bool = True
    config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The request's LoRA targets resolved once (adapt()); memory, speed and the training plan read them.
    adapted: Adapted | None = field(default=None, repr=False, compare=False)

    @property
    def layers(self) -> int:
        return sum(g.layers for g in self.groups)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def ffn_per_token(self) -> int:
        return self.active_ffn or self.intermediate

    @property
    def block_linear_params(self) -> int:
        """Parameters bitsandbytes quantizes to 4 bits (Linear layers inside the blocks)."""
        return sum(g.layers * sum(lin.params for lin in g.linears) for g in self.groups)

    @property
    def parameters(self) -> int:
        blocks = sum(g.layers * (sum(lin.params for lin in g.linears) + g.other_params) for g in self.groups)
        return blocks + self.embedding_params + self.global_other_params

    @property
    def active_parameters(self) -> int:
        blocks = sum(
            g.layers * (sum(lin.active_params for lin in g.linears) + g.other_params) for g in self.groups
        )
        return blocks + self.embedding_params + self.global_other_params

    @property
    def matmul_parameters(self) -> int:
        """Active parameters that do a matmul per token: blocks plus the lm_head (not the lookup)."""
        blocks = sum(g.layers * sum(lin.active_params for lin in g.linears) for g in self.groups)
        return blocks + self.vocab * self.hidden

    def linear_names(self) -> list[str]:
        names: list[str] = []
        for g in self.groups:
            for lin in g.linears:
                if lin.name not in names:
                    names.append(lin.name)
        return names

    def adapt(self, targets: list[str] | str) -> Architecture:
        """This model with ``targets`` resolved once: every later lora_targets(targets) reads the result
        (BadRequestError naming the model's layers when none match). Already adapted to them: itself."""
        if self.adapted is not None and self.adapted.asked == _asked(targets):
            return self
        return replace(self, adapted=Adapted(_asked(targets), tuple(self._resolve_targets(targets))))

    def lora_targets(self, targets: list[str] | str) -> list[Linear]:
        """The Linear layers (of the first group that has them) adapted by `targets`: those adapt() resolved
        when they are the same targets, else resolved now."""
        if self.adapted is not None and self.adapted.asked == _asked(targets):
            return list(self.adapted.linears)
        return self._resolve_targets(targets)

    def _resolve_targets(self, targets: list[str] | str) -> list[Linear]:
        """Match what the person typed (module names, roles such as q or mlp, all-linear) to Linear layers."""
        if targets == "all-linear":
            return [lin for g in self.groups for lin in g.linears]  # PEFT: every Linear but lm_head
        if isinstance(targets, str):
            targets = [t for t in targets.split(",") if t.strip()]
        wanted_roles: set[str] = set()
        wanted_names: set[str] = set()
        for raw in targets:
            t = raw.strip().lower()
            if t in ROLE_ALIASES:
                wanted_roles.update(ROLE_ALIASES[t])
            wanted_names.add(t)
        chosen = [
            lin
            for g in self.groups
            for lin in g.linears
            if lin.name in wanted_names or wanted_roles.intersection(lin.roles)
        ]
        if not chosen:
            raise BadRequestError(
                f"LoRA targets {', '.join(targets)} match no layer of {self.name}; "
                f"its Linear layers are: {', '.join(self.linear_names())} (or use all-linear)"
            )
        return chosen

    def lora_parameters(self, r: int, targets: list[str] | str = "all-linear") -> int:
        """Exactly what PEFT reports as trainable: r*(d_in+d_out) per adapted Linear (and expert)."""
        chosen = set(map(id, self.lora_targets(targets)))
        return sum(
            g.layers * sum(lin.lora_params(r) for lin in g.linears if id(lin) in chosen) for g in self.groups
        )


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _decoder(cfg: dict[str, Any], name: str) -> Architecture:
    mt = str(cfg.get("model_type", "llama")).lower()
    h = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_get(cfg, "num_attention_heads", "n_head", "num_heads"))
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    hd = int(_get(cfg, "head_dim", default=h // heads))
    ffn = int(_get(cfg, "intermediate_size", "ffn_dim", default=4 * h))
    vocab = int(cfg["vocab_size"])
    tied = bool(_get(cfg, "tie_word_embeddings", default=mt.startswith("gemma")))
    q_dim, kv_dim = heads * hd, kv * hd
    attn_bias = bool(cfg.get("attention_bias", False))
    qkv_bias = attn_bias or mt in ("qwen2", "qwen2_moe")
    mlp_bias = bool(cfg.get("mlp_bias", False))

    if mt == "phi3":
        attn = [
            Linear("qkv_proj", h, q_dim + 2 * kv_dim, ("q", "k", "v"), qkv_bias),
            Linear("o_proj", q_dim, h, ("o",), attn_bias),
        ]
    else:
        attn = [
            Linear("q_proj", h, q_dim, ("q",), qkv_bias),
            Linear("k_proj", h, kv_dim, ("k",), qkv_bias),
            Linear("v_proj", h, kv_dim, ("v",), qkv_bias),
            Linear("o_proj", q_dim, h, ("o",), attn_bias),
        ]

    norms_per_layer = 4 if mt in ("gemma2", "gemma3", "gemma3_text") else 2
    other = norms_per_layer * h
    if mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2"):
        other += 2 * hd  # q_norm and k_norm over head_dim
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    top_k = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=0) or 0)
    active_ffn = 0
    if experts > 1:
        moe_ffn = int(_get(cfg, "moe_intermediate_size", default=ffn))
        mlp = [
            Linear("gate_proj", h, moe_ffn, ("gate",), mlp_bias, experts, top_k),
            Linear("up_proj", h, moe_ffn, ("up",), mlp_bias, experts, top_k),
            Linear("down_proj", moe_ffn, h, ("down",), mlp_bias, experts, top_k),
            Linear("gate", h, experts, ("router",)),
        ]
        active_ffn = moe_ffn * top_k
        shared = int(cfg.get("shared_expert_intermediate_size", 0) or 0)
        if shared:
            mlp += [
                Linear("shared_expert.gate_proj", h, shared, ("gate",)),
                Linear("shared_expert.up_proj", h, shared, ("up",)),
                Linear("shared_expert.down_proj", shared, h, ("down",)),
                Linear("shared_expert_gate", h, 1, ("router",)),
            ]
            active_ffn += shared
        ffn = moe_ffn
    elif mt == "phi3":
        mlp = [
            Linear("gate_up_proj", h, 2 * ffn, ("gate", "up"), mlp_bias),
            Linear("down_proj", ffn, h, ("down",), mlp_bias),
        ]
    else:
        mlp = [
            Linear("gate_proj", h, ffn, ("gate",), mlp_bias),
            Linear("up_proj", h, ffn, ("up",), mlp_bias),
            Linear("down_proj", ffn, h, ("down",), mlp_bias),
        ]
    embed = vocab * h * (1 if tied else 2)
    return Architecture(
        name=name,
        model_type=mt,
        hidden=h,
        intermediate=ffn,
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        vocab=vocab,
        tied=tied,
        groups=(BlockGroup(layers, tuple(attn + mlp), other),),
        embedding_params=embed,
        global_other_params=h,
        experts=experts if experts > 1 else 0,
        experts_per_token=top_k if experts > 1 else 0,
        active_ffn=active_ffn,
        config=cfg,
    )


def _bloom(cfg: dict[str, Any], name: str) -> Architecture:
    h = int(_get(cfg, "hidden_size", "n_embed"))
    layers = int(_get(cfg, "n_layer", "num_hidden_layers"))
    heads = int(_get(cfg, "n_head", "num_attention_heads"))
    vocab = int(cfg["vocab_size"])
    linears = (
        Linear("query_key_value", h, 3 * h, ("q", "k", "v"), True),
        Linear("dense", h, h, ("o",), True),
        Linear("dense_h_to_4h", h, 4 * h, ("up",), True),
        Linear("dense_4h_to_h", 4 * h, h, ("down",), True),
    )
    return Architecture(
        name=name,
        model_type="bloom",
        hidden=h,
        intermediate=4 * h,
        heads=heads,
        kv_heads=heads,
        head_dim=h // heads,
        vocab=vocab,
        tied=True,
        groups=(BlockGroup(layers, linears, 4 * h),),
        embedding_params=vocab * h,
        global_other_params=4 * h,
        gated_mlp=False,
        config=cfg,
    )


def _t5(cfg: dict[str, Any], name: str) -> Architecture:
    d = int(cfg["d_model"])
    ff = int(cfg["d_ff"])
    heads = int(cfg["num_heads"])
    dkv = int(cfg["d_kv"])
    inner = heads * dkv
    enc = int(cfg["num_layers"])
    dec = int(cfg.get("num_decoder_layers") or enc)
    vocab = int(cfg["vocab_size"])
    gated = "gated" in str(cfg.get("feed_forward_proj", "relu"))
    tied = bool(cfg.get("tie_word_embeddings", True))
    buckets = int(cfg.get("relative_attention_num_buckets", 32))

    def attention(prefix: str) -> list[Linear]:
        return [
            Linear(f"{prefix}.q", d, inner, ("q",)),
            Linear(f"{prefix}.k", d, inner, ("k",)),
            Linear(f"{prefix}.v", d, inner, ("v",)),
            Linear(f"{prefix}.o", inner, d, ("o",)),
        ]

    mlp = (
        [Linear("wi_0", d, ff, ("gate",)), Linear("wi_1", d, ff, ("up",))]
        if gated
        else [Linear("wi", d, ff, ("up",))]
    )
    mlp.append(Linear("wo", ff, d, ("down",)))
    enc_group = BlockGroup(enc, tuple(attention("SelfAttention") + mlp), 2 * d)
    dec_group = BlockGroup(dec, tuple(attention("SelfAttention") + attention("EncDecAttention") + mlp), 3 * d)
    return Architecture(
        name=name,
        model_type=str(cfg.get("model_type", "t5")),
        hidden=d,
        intermediate=ff,
        heads=heads,
        kv_heads=heads,
        head_dim=dkv,
        vocab=vocab,
        tied=tied,
        groups=(enc_group, dec_group),
        embedding_params=vocab * d * (1 if tied else 2),
        global_other_params=2 * d + 2 * buckets * heads,
        gated_mlp=gated,
        config=cfg,
    )


def from_config(cfg: dict[str, Any], name: str = "model") -> Architecture:
    """Build the Architecture of a config.json dict; PlanningError when it is not a language model."""
    if "text_config" in cfg and "vocab_size" not in cfg:
        cfg = {
            **cfg["text_config"],
            "model_type": cfg["text_config"].get("model_type", cfg.get("model_type")),
        }
    mt = str(cfg.get("model_type", "")).lower()
    try:
        if mt == "bloom":
            return _bloom(cfg, name)
        if mt in ("t5", "mt5", "umt5"):
            return _t5(cfg, name)
        return _decoder(cfg, name)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise PlanningError(
            f"{name}: config.json lacks what a decoder language model needs ({exc!s}); "
            "supported: Llama, Mistral, Mixtral, Qwen2/2.5/3 (+MoE), Gemma 1-3, Phi-3, Bloom, T5"
        ) from None
