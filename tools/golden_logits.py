#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers' Gemma 4 text model for a synthetic GGUF.

Reads a GGUF written by `gemmajit synth` (metadata + tensors, dequantized to f32 with numpy),
builds transformers' Gemma4ForCausalLM from the GGUF's config in fp32 with eager attention on
the CPU, loads the weights (GGUF -> HF names per reference/gemma4-spec.md section 3.3; ggml dims
are reversed torch shapes), runs one token sequence several sliding windows long and writes

  <out>/<variant>.json        how the model was made (variant, wtype, seed, FNV-1a 64 of the
                              GGUF's tensor data section), the tokens, versions, HF-side
                              structure checks
  <out>/<variant>.logits.f32  logits, [positions][vocab] little-endian f32
  <out>/<variant>.hidden.f32  (debug, not committed) HF hidden states [L+1][positions][d]

tests/cpu/test_cpu_forward_golden.cpp re-synthesizes the same file and compares the CPU forward.

Regenerating (needs torch and transformers >= 5 with gemma4, e.g. on the GPU machine):
  for v in tiny tiny-e2b tiny-keqv tiny-moe; do
    gemmajit synth --variant $v --wtype <see tests/data/golden/$v.json> --seed 1 -o /tmp/$v.gguf
    python3 tools/golden_logits.py --gguf /tmp/$v.gguf --out-dir tests/data/golden
  done

`--parse-only` checks the GGUF reading and the HF name/shape mapping without torch.
"""

import argparse
import json
import struct
import sys

# ------------------------------------------------------------------------------------------------
# GGUF reading. Metadata parsing is pure Python; tensor payloads need numpy (imported lazily so
# the parser can be exercised without it).

GGUF_MAGIC = b"GGUF"
VT_UINT8, VT_INT8, VT_UINT16, VT_INT16, VT_UINT32, VT_INT32, VT_FLOAT32 = range(7)
VT_BOOL, VT_STRING, VT_ARRAY, VT_UINT64, VT_INT64, VT_FLOAT64 = range(7, 13)
_SCALAR = {
    VT_UINT8: "<B", VT_INT8: "<b", VT_UINT16: "<H", VT_INT16: "<h", VT_UINT32: "<I",
    VT_INT32: "<i", VT_FLOAT32: "<f", VT_BOOL: "<?", VT_UINT64: "<Q", VT_INT64: "<q",
    VT_FLOAT64: "<d",
}
# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 8: ("q8_0", 32, 34),
              30: ("bf16", 1, 2)}
# llama_ftype -> weight type name (as `gemmajit synth --wtype` spells it)
FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 7: "q8_0", 32: "bf16"}


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"GGUF truncated at byte {self.pos} (wanted {n} more)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vt):
        fmt = _SCALAR[vt]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar(VT_UINT64)
        return self.take(n).decode("utf-8")

    def value(self, vt):
        if vt == VT_STRING:
            return self.string()
        if vt == VT_ARRAY:
            et = self.scalar(VT_UINT32)
            n = self.scalar(VT_UINT64)
            return [self.value(et) for _ in range(n)]
        if vt not in _SCALAR:
            raise ValueError(f"unknown GGUF value type {vt}")
        return self.scalar(vt)


class Gguf:
    """metadata: dict key -> value; tensors: dict name -> (type id, ggml dims, byte offset)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        r = Reader(self.data)
        if r.take(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        version = r.scalar(VT_UINT32)
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        n_tensors = r.scalar(VT_UINT64)
        n_kv = r.scalar(VT_UINT64)
        self.metadata = {}
        for _ in range(n_kv):
            key = r.string()
            self.metadata[key] = r.value(r.scalar(VT_UINT32))
        self.tensors = {}
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar(VT_UINT32)
            dims = [r.scalar(VT_UINT64) for _ in range(n_dims)]
            ttype = r.scalar(VT_UINT32)
            offset = r.scalar(VT_UINT64)
            self.tensors[name] = (ttype, dims, offset)
        align = self.metadata.get("general.alignment", 32)
        self.data_start = (r.pos + align - 1) // align * align

    def has(self, name):
        return name in self.tensors

    def dims(self, name):
        return self.tensors[name][1]

    def array(self, name):
        """The tensor as a float32 numpy array in torch order (ggml dims reversed)."""
        import numpy as np
        ttype, dims, offset = self.tensors[name]
        if ttype not in GGML_TYPES:
            raise ValueError(f"tensor {name}: ggml type {ttype} not supported by this script")
        _, block, block_bytes = GGML_TYPES[ttype]
        n = 1
        for d in dims:
            n *= d
        start = self.data_start + offset
        raw = np.frombuffer(self.data, dtype=np.uint8, count=n // block * block_bytes, offset=start)
        out = dequantize(ttype, raw, n)
        return out.reshape(list(reversed(dims)))


def dequantize(ttype, raw, n):
    import numpy as np
    if ttype == 0:
        return raw.view(np.float32).copy()
    if ttype == 1:
        return raw.view(np.float16).astype(np.float32)
    if ttype == 30:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if ttype == 8:  # Q8_0: f16 scale, 32 x int8
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(n)
    if ttype == 2:  # Q4_0: f16 scale, 16 bytes; low nibbles = elements 0..15, high = 16..31
        b = raw.reshape(-1, 18)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qs = b[:, 2:]
        lo = (qs & 0x0F).astype(np.int16) - 8
        hi = (qs >> 4).astype(np.int16) - 8
        q = np.concatenate([lo, hi], axis=1).astype(np.float32)
        return (q * d).reshape(n)
    raise ValueError(f"ggml type {ttype} not supported")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ------------------------------------------------------------------------------------------------
# GGUF -> HF config and weights.

def per_layer(meta, key, n_layers):
    v = meta[key]
    return list(v) if isinstance(v, list) else [v] * n_layers


class ModelDesc:
    """The model described by the GGUF, in the terms HF's Gemma4TextConfig needs."""

    def __init__(self, g):
        m = g.metadata
        if m.get("general.architecture") != "gemma4":
            raise ValueError("general.architecture is not gemma4")
        p = "gemma4."
        self.L = m[p + "block_count"]
        self.d = m[p + "embedding_length"]
        self.H = m[p + "attention.head_count"]
        self.V = g.dims("token_embd.weight")[1]
        self.sliding = list(m[p + "attention.sliding_window_pattern"])
        self.kv_heads = per_layer(m, p + "attention.head_count_kv", self.L)
        self.ffn = per_layer(m, p + "feed_forward_length", self.L)
        self.hd_global = m[p + "attention.key_length"]
        self.hd_swa = m[p + "attention.key_length_swa"]
        self.window = m[p + "attention.sliding_window"]
        self.shared = m.get(p + "attention.shared_kv_layers", 0)
        self.P = m.get(p + "embedding_length_per_layer_input", 0)
        self.eps = m[p + "attention.layer_norm_rms_epsilon"]
        self.softcap = m.get(p + "final_logit_softcapping", 30.0)
        self.base_global = m.get(p + "rope.freq_base", 1e6)
        self.base_swa = m.get(p + "rope.freq_base_swa", 1e4)
        self.ctx = m.get(p + "context_length", 131072)
        self.E = m.get(p + "expert_count", 0)
        self.K = m.get(p + "expert_used_count", 0)
        self.F = m.get(p + "expert_feed_forward_length", 0)
        first_shared = self.L - self.shared
        own = range(first_shared)
        self.has_v = [g.has(f"blk.{i}.attn_v.weight") for i in range(self.L)]
        glob_own = [i for i in own if not self.sliding[i]]
        self.k_eq_v = any(not self.has_v[i] for i in glob_own)
        # What HF can express: one KV head count for sliding layers, one for global layers
        # (num_global_key_value_heads only with attention_k_eq_v), k_eq_v on all global layers.
        kv_s = {self.kv_heads[i] for i in range(self.L) if self.sliding[i]}
        kv_g = {self.kv_heads[i] for i in range(self.L) if not self.sliding[i]}
        if len(kv_s) != 1 or len(kv_g) > 1:
            raise ValueError(f"HF needs uniform KV heads per layer type: {self.kv_heads}")
        self.kv_swa = kv_s.pop()
        self.kv_global = kv_g.pop() if kv_g else self.kv_swa
        if not self.k_eq_v and self.kv_global != self.kv_swa:
            raise ValueError("different global KV heads need attention_k_eq_v in HF")
        if self.k_eq_v and any(self.has_v[i] for i in glob_own):
            raise ValueError("HF applies k_eq_v to every global layer; this GGUF mixes")
        if any(not self.has_v[i] for i in own if self.sliding[i]):
            raise ValueError("a sliding layer without attn_v cannot be expressed in HF")
        base_ffn = self.ffn[0]
        self.double_wide = any(self.ffn[i] != base_ffn for i in range(self.L))
        for i in range(self.L):
            want = base_ffn * (2 if self.double_wide and i >= first_shared else 1)
            if self.ffn[i] != want:
                raise ValueError(f"FFN widths {self.ffn} are not HF's (double-wide) pattern")
        # Proportional RoPE: count the 1.0 entries of rope_freqs (the rest are ~1e30).
        self.rope_pairs = int(self.hd_global * 0.25) // 2
        if g.has("rope_freqs.weight"):
            import numpy as np
            rf = g.array("rope_freqs.weight")
            self.rope_pairs = int(np.sum(rf == 1.0))
        self.partial_rotary_factor = 2.0 * self.rope_pairs / self.hd_global
        # KV donors by HF's rule: the last layer before first_shared of the same type.
        self.donors = {}
        for i in range(first_shared, self.L):
            self.donors[i] = max(j for j in own if self.sliding[j] == self.sliding[i])

    def hf_config_kwargs(self):
        return dict(
            vocab_size=self.V,
            hidden_size=self.d,
            intermediate_size=self.ffn[0],
            num_hidden_layers=self.L,
            num_attention_heads=self.H,
            num_key_value_heads=self.kv_swa,
            head_dim=self.hd_swa,
            global_head_dim=self.hd_global,
            num_global_key_value_heads=self.kv_global if self.k_eq_v else None,
            hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=self.ctx,
            rms_norm_eps=self.eps,
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": self.base_swa},
                "full_attention": {"rope_type": "proportional",
                                   "partial_rotary_factor": self.partial_rotary_factor,
                                   "rope_theta": self.base_global},
            },
            attention_bias=False,
            sliding_window=self.window,
            layer_types=["sliding_attention" if s else "full_attention" for s in self.sliding],
            final_logit_softcapping=self.softcap,
            vocab_size_per_layer_input=self.V,
            hidden_size_per_layer_input=self.P,
            attention_k_eq_v=self.k_eq_v,
            num_kv_shared_layers=self.shared,
            enable_moe_block=self.E > 0,
            use_double_wide_mlp=self.double_wide,
            num_experts=self.E or None,
            top_k_experts=self.K or None,
            moe_intermediate_size=self.F or None,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
            use_cache=False,
        )


# GGUF name (per layer: suffix after "blk.N.") -> HF state-dict name (per layer: after
# "model.layers.N.").
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
}
IGNORED = {"rope_freqs.weight"}  # expressed by the config's partial_rotary_factor


def hf_weights(g):
    """HF state-dict name -> float32 numpy array (torch shape)."""
    out = {}
    for name in g.tensors:
        if name in IGNORED:
            continue
        if name in GLOBAL_NAMES:
            out[GLOBAL_NAMES[name]] = g.array(name)
            continue
        parts = name.split(".", 2)
        if parts[0] != "blk" or parts[2] not in LAYER_NAMES:
            raise ValueError(f"no HF name for GGUF tensor {name}")
        out[f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"] = g.array(name)
    return out


def golden_tokens(n, vocab):
    """BOS then a fixed LCG sequence (recorded in the JSON; the C++ test reads it back)."""
    toks, s = [2], 12345
    while len(toks) < n:
        s = (s * 1103515245 + 12345) & 0xFFFFFFFF
        toks.append((s >> 8) % vocab)
    return toks


# ------------------------------------------------------------------------------------------------
# HF model.

def build_hf_model(desc, log):
    import inspect
    import torch
    import transformers
    from transformers.models import gemma4 as g4

    kwargs = desc.hf_config_kwargs()
    cfg = None
    dropped = []
    while cfg is None:
        try:
            cfg = g4.Gemma4TextConfig(**kwargs)
        except Exception as e:  # noqa: BLE001 - a kwarg this transformers version rejects
            bad = [k for k in kwargs if f"'{k}'" in str(e)]
            if not bad:
                raise
            for k in bad:
                dropped.append(k)
                kwargs.pop(k)
    if dropped:
        log(f"transformers {transformers.__version__} rejected config kwargs {dropped}")
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001 - property may be read-only in some versions
        log(f"could not set _attn_implementation on the config: {e}")
    torch.manual_seed(0)
    model = g4.Gemma4ForCausalLM(cfg)
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log(f"set_attn_implementation('eager') failed: {e}")
    model = model.float().eval()
    log(f"attention implementation: {getattr(model.config, '_attn_implementation', '?')}")
    print(f"Gemma4TextConfig signature: {inspect.signature(g4.Gemma4TextConfig)}")
    return model


def load_weights(model, weights, desc, log):
    import numpy as np
    import torch
    sd = model.state_dict()
    problems = []
    direct = {}  # weights HF keeps as non-persistent buffers (absent from the state dict)
    for k, v in weights.items():
        if k not in sd:
            owner, _, attr = k.rpartition(".")
            target = getattr(model.get_submodule(owner), attr, None) if owner else None
            if isinstance(target, torch.Tensor) and tuple(target.shape) == tuple(v.shape):
                direct[k] = target
                log(f"{k}: not in the state dict, set as a buffer")
            else:
                problems.append(f"HF model has no {k} (GGUF shape {list(v.shape)})")
        elif tuple(sd[k].shape) != tuple(v.shape):
            problems.append(f"{k}: HF shape {list(sd[k].shape)} vs GGUF {list(v.shape)}")
    tied = {"lm_head.weight"}
    first_shared = desc.L - desc.shared

    def unused_by_hf(k):
        # HF ignores K/V projections that a version may still create on KV-shared layers.
        parts = k.split(".")
        return (len(parts) > 4 and parts[:2] == ["model", "layers"] and
                int(parts[2]) >= first_shared and parts[3] == "self_attn" and
                parts[4] in ("k_proj", "v_proj", "k_norm", "v_norm"))

    unset = [k for k in sd if k not in weights and k not in tied]
    for k in [k for k in unset if unused_by_hf(k)]:
        log(f"{k}: exists in HF but is unused on a KV-shared layer; left at init")
    unset = [k for k in unset if not unused_by_hf(k)]
    if unset:
        problems.append(f"HF tensors left at random init: {unset}")
    if problems:
        log("HF state dict keys: " + ", ".join(f"{k}{list(t.shape)}" for k, t in sd.items()))
        raise RuntimeError("weight mapping failed:\n  " + "\n  ".join(problems))
    loadable = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()
                if k not in direct}
    missing, unexpected = model.load_state_dict(loadable, strict=False)
    missing = [k for k in missing if k not in tied and not unused_by_hf(k)]
    if unexpected or missing:
        raise RuntimeError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
    for k, target in direct.items():
        target.copy_(torch.from_numpy(np.ascontiguousarray(weights[k])))
    lm = model.lm_head.weight.detach()
    emb = model.model.embed_tokens.weight.detach()
    if not torch.equal(lm, emb):
        # GGUF embeddings are tied; some versions tie only inside from_pretrained.
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        if not torch.equal(model.lm_head.weight.detach(), emb):
            model.lm_head.weight.copy_(emb)
            log("lm_head was not tied after loading; copied embed_tokens into it")


def hf_structure(model, desc):
    """What HF built, per layer, to cross-check against the GGUF-derived description."""
    info = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        info.append({
            "sliding": bool(getattr(a, "is_sliding", None)),
            "head_dim": int(a.head_dim),
            "q_out": int(a.q_proj.weight.shape[0]),
            "kv_shared": bool(getattr(a, "is_kv_shared_layer", False)),
            "store_full_length_kv": bool(getattr(a, "store_full_length_kv", False)),
            "k_out": int(a.k_proj.weight.shape[0]) if getattr(a, "k_proj", None) is not None else 0,
            "v_proj": getattr(a, "v_proj", None) is not None,
            "ffn": int(layer.mlp.gate_proj.weight.shape[0]),
        })
    # HF donors: the layer of each type that stores full-length KV.
    stores = {info[i]["sliding"]: i for i in range(len(info)) if info[i]["store_full_length_kv"]}
    hf_donors = {i: stores.get(info[i]["sliding"]) for i in range(len(info)) if info[i]["kv_shared"]}
    if hf_donors and hf_donors != desc.donors:
        raise RuntimeError(f"HF KV donors {hf_donors} differ from the GGUF rule {desc.donors}")
    return info, {str(k): v for k, v in hf_donors.items()}


def run(args):
    import numpy as np
    import torch
    import transformers

    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    g = Gguf(args.gguf)
    desc = ModelDesc(g)
    variant = g.metadata.get("gemmajit.synth.variant")
    seed = g.metadata.get("gemmajit.synth.seed")
    wtype = FILE_TYPES.get(g.metadata.get("general.file_type"))
    if variant is None or seed is None or wtype is None:
        raise ValueError("not a gemmajit synthetic GGUF (gemmajit.synth.* / file_type missing)")
    torch.set_grad_enabled(False)
    model = build_hf_model(desc, log)
    load_weights(model, hf_weights(g), desc, log)
    structure, hf_donors = hf_structure(model, desc)

    tokens = golden_tokens(args.positions, desc.V)
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    logits = out.logits[0].float().numpy().astype("<f4")
    if logits.shape != (len(tokens), desc.V) or not np.all(np.isfinite(logits)):
        raise RuntimeError(f"bad logits shape {logits.shape} or non-finite values")

    base = f"{args.out_dir}/{variant}"
    logits.tofile(base + ".logits.f32")
    if out.hidden_states is not None:
        hs = np.stack([h[0].float().numpy() for h in out.hidden_states]).astype("<f4")
        hs.tofile(base + ".hidden.f32")
    header = {
        "variant": variant,
        "wtype": wtype,
        "seed": seed,
        "tensor_data_fnv1a64": fnv1a64(g.data[g.data_start:]),
        "tokens": tokens,
        "vocab_size": desc.V,
        "logits_file": f"{variant}.logits.f32",
        "logits_layout": "[positions][vocab] little-endian f32",
        "producer": "tools/golden_logits.py: transformers Gemma4ForCausalLM, fp32, CPU, eager",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "hf_kv_donors": hf_donors,
        "hf_layers": structure,
        "notes": log_lines,
    }
    with open(base + ".json", "w") as f:
        json.dump(header, f, indent=1)
        f.write("\n")
    amax = logits.argmax(axis=1)
    log(f"{variant}: {len(tokens)} positions, max|logit| {np.abs(logits).max():.4f}, "
        f"argmax[:8] {amax[:8].tolist()}")


def parse_only(args):
    g = Gguf(args.gguf)
    desc = ModelDesc(g)
    weights = hf_weights(g)
    print(json.dumps(desc.hf_config_kwargs(), indent=1, default=str))
    print("donors", desc.donors, "rope_pairs", desc.rope_pairs)
    for k, v in sorted(weights.items()):
        print(f"{k} {list(v.shape)} mean {float(v.mean()):.5f} std {float(v.std()):.5f}")
    print("tensor_data_fnv1a64", fnv1a64(g.data[g.data_start:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="synthetic GGUF from `gemmajit synth`")
    ap.add_argument("--out-dir", default=".", help="where <variant>.json/.logits.f32 go")
    ap.add_argument("--positions", type=int, default=40, help="sequence length")
    ap.add_argument("--parse-only", action="store_true", help="no torch: check the mapping")
    args = ap.parse_args()
    if args.parse_only:
        parse_only(args)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
