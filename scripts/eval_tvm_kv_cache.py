"""Evaluation of TVM 0.27's own KV cache for LLM generation on the CPU (issue E17, item 3).

A LLaMA-style decoder written with ``relax.frontend.nn`` whose attention goes through
``relax.frontend.nn.llm.kv_cache.TIRPagedKVCache`` (which brings its own CPU TIR kernels
when the target is ``llvm``), weights loaded from a random-init transformers
``LlamaForCausalLM``; the module exports ``create_kv_cache``, ``prefill`` and ``decode``
and is built with TVM's own pipeline (not ours: this is the baseline to build on). It
checks greedy tokens against transformers' ``generate`` and times decode.

Found (2-core Xeon, 2026-12-05): tokens equal transformers' (20/20 tiny, 64/64 for hidden
1024 / 4 layers / vocab 32000); the cache object is written in place (``prefill``/``decode``
return the object they were given, pages are consumed, the K/V read back equal
transformers' ``past_key_values``); but TVM's default CPU pipeline leaves the projections
unscheduled (a transpose copy of every weight per call), so decode is several times
slower than transformers eager; ``FuseTransposeMatmul`` + DLight's CPU GEMV rule helps
but stays far from memory speed. The cache is the part to reuse; the GEMV/GEMM kernels
must be ours.

    python -m scripts.eval_tvm_kv_cache                 # tiny config, default pipeline
    python -m scripts.eval_tvm_kv_cache --tie           # tied lm_head
    python -m scripts.eval_tvm_kv_cache --dlight        # FuseTransposeMatmul + DLight CPU rules
    python -m scripts.eval_tvm_kv_cache --big [--dlight]  # hidden 1024, 4 layers, prompt 128, 64 new
"""
import argparse
import os
import time

import numpy as np
import torch
import tvm
from transformers import LlamaConfig, LlamaForCausalLM
from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache

from aicf_tvm.runtime.threads import thread_count, use_threads

TARGET = tvm.target.Target("llvm")


# ----------------------------------------------------------------------------- model
WEIGHT_KN = os.environ.get("E17_WEIGHT_KN", "0") == "1"  # store Linear weights as (in, out)


class LinearKN(nn.Module):
    """Linear with weight stored pre-transposed as (in_features, out_features): y = x @ W.
    Avoids the per-call transpose of nn.Linear and gives DLight's CPU GEMV rule a contiguous
    vectorised axis (the output axis)."""

    def __init__(self, in_features, out_features, bias=False):
        assert not bias
        self.weight = nn.Parameter((in_features, out_features), "float32")

    def forward(self, x):
        return op.matmul(x, self.weight)


def Linear(i, o, bias=False):
    return LinearKN(i, o) if WEIGHT_KN else nn.Linear(i, o, bias=bias)


class Attention(nn.Module):
    def __init__(self, cfg):
        self.h_q = cfg.num_attention_heads
        self.h_kv = cfg.num_key_value_heads
        self.d = cfg.hidden_size // cfg.num_attention_heads
        self.qkv_proj = Linear(cfg.hidden_size, (self.h_q + 2 * self.h_kv) * self.d, bias=False)
        self.o_proj = Linear(self.h_q * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cache: PagedKVCache, layer_id: int):
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.h_q + 2 * self.h_kv, self.d))
        # RoPE (RopeMode.NORMAL) + append K/V to the paged cache + attention, all inside the builtin
        o = cache.attention_with_fused_qkv(layer_id, qkv, self.h_q, sm_scale=self.d**-0.5)
        return self.o_proj(op.reshape(o, (b, s, self.h_q * self.d)))


class MLP(nn.Module):
    def __init__(self, cfg):
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor):
        g, u = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(g) * u)


class Layer(nn.Module):
    def __init__(self, cfg):
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False)

    def forward(self, x, cache, layer_id):
        x = x + self.self_attn(self.input_layernorm(x), cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, cfg):
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False)

    def forward(self, input_ids, cache):
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cache, i)
        return self.norm(x)


class LlamaNN(nn.Module):
    def __init__(self, cfg):
        self.cfg = cfg
        self.model = Model(cfg)
        self.tie = cfg.tie_word_embeddings
        if not self.tie:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def _logits(self, h):
        if self.tie:
            return op.matmul(h, op.permute_dims(self.model.embed_tokens.weight), out_dtype="float32")
        return self.lm_head(h)

    def prefill(self, input_ids: Tensor, cache: PagedKVCache):
        h = self.model(input_ids, cache)  # (1, s, hidden)
        # keep the last position only (as MLC-LLM does)

        def _last(x: te.Tensor):
            b, s, d = x.shape
            return te.compute((b, 1, d), lambda i, _, k: x[i, s - 1, k], name="last")

        h = op.tensor_expr_op(_last, name_hint="last", args=[h])
        return self._logits(h), cache

    def decode(self, input_ids: Tensor, cache: PagedKVCache):
        h = self.model(input_ids, cache)  # (1, 1, hidden)
        return self._logits(h), cache

    def create_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                        prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                        support_sliding_window: tirx.Var):
        c = self.cfg
        d = c.hidden_size // c.num_attention_heads
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=relax.ShapeExpr([0, c.num_hidden_layers]),
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            qk_head_dim=d,
            v_head_dim=d,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NORMAL,
            rope_scale=1,
            rope_theta=_rope_theta(c),
            rope_scaling={},
            rope_ext_factors=relax.prim_value(0),
            rotary_dim=d,
            enable_disaggregation=False,
            dtype="float32",
            target=TARGET,
        )


def _rope_theta(c):
    rp = getattr(c, "rope_parameters", None)  # transformers >= 5
    if rp and "rope_theta" in rp:
        assert rp.get("rope_type", "default") == "default"
        return rp["rope_theta"]
    return c.rope_theta


def export_spec(m: LlamaNN):
    return {
        "prefill": {
            "input_ids": nn.spec.Tensor([1, "seq_len"], "int32"),
            "cache": nn.spec.Object(object_type=PagedKVCache),
            "$": {"param_mode": "packed", "effect_mode": "none"},
        },
        "decode": {
            "input_ids": nn.spec.Tensor([1, 1], "int32"),
            "cache": nn.spec.Object(object_type=PagedKVCache),
            "$": {"param_mode": "packed", "effect_mode": "none"},
        },
        "create_kv_cache": {
            "max_batch_size": int,
            "max_total_seq_len": int,
            "prefill_chunk_size": int,
            "page_size": int,
            "support_sliding_window": int,
            "$": {"param_mode": "none", "effect_mode": "none"},
        },
    }


# ----------------------------------------------------------------------------- weights
def map_hf_weights(hf_sd, params, cfg):
    """HF LlamaForCausalLM state_dict -> list of tvm tensors in exported param order."""
    sd = {k: v.detach().float().numpy() for k, v in hf_sd.items()}
    out = []
    for name, _p in params:
        if name.endswith("self_attn.qkv_proj.weight"):
            pre = name[: -len("qkv_proj.weight")]
            arr = np.concatenate([sd[pre + "q_proj.weight"], sd[pre + "k_proj.weight"], sd[pre + "v_proj.weight"]], 0)
        elif name.endswith("mlp.gate_up_proj.weight"):
            pre = name[: -len("gate_up_proj.weight")]
            arr = np.concatenate([sd[pre + "gate_proj.weight"], sd[pre + "up_proj.weight"]], 0)
        else:
            arr = sd[name]
        want = tuple(int(x) for x in _p.shape)
        if WEIGHT_KN and (name.endswith("proj.weight") or name == "lm_head.weight"):
            arr = arr.T  # LinearKN layout (in, out); note square matrices need it too
        assert tuple(arr.shape) == want, (name, arr.shape, _p.shape)
        out.append(tvm.runtime.tensor(np.ascontiguousarray(arr.astype("float32")), tvm.cpu()))
    return out


# ----------------------------------------------------------------------------- runtime
class Generator:
    def __init__(self, vm, params, max_len, page_size):
        self.vm = vm
        self.params = params
        self.dev = tvm.cpu()
        self.f_prefill = vm["prefill"]
        self.f_decode = vm["decode"]
        # args: max_batch_size, max_total_seq_len, prefill_chunk_size, page_size, support_sliding_window
        # spec `int` args are exported as R.Shape([var]) params -> pass ShapeTuple([v])
        S = tvm.runtime.ShapeTuple
        self.cache = vm["create_kv_cache"](S([1]), S([max_len]), S([max_len]), S([page_size]), S([0]))
        g = tvm.get_global_func
        self.f_add_seq = g("vm.builtin.kv_state_add_sequence")
        self.f_remove_seq = g("vm.builtin.kv_state_remove_sequence")
        self.f_begin = g("vm.builtin.kv_state_begin_forward")
        self.f_end = g("vm.builtin.kv_state_end_forward")
        self.f_seq_len = g("vm.builtin.attention_kv_cache_get_sequence_length")
        self.f_debug_kv = g("vm.builtin.attention_kv_cache_debug_get_kv")

    def step(self, f, ids):
        n = len(ids)
        self.f_begin(self.cache, tvm.runtime.ShapeTuple([0]), tvm.runtime.ShapeTuple([n]))
        x = tvm.runtime.tensor(np.array([ids], dtype="int32"), self.dev)
        logits, cache_out = f(x, self.cache, self.params)
        self.f_end(self.cache)
        return logits, cache_out

    def generate(self, prompt, n_new, times=None):
        self.f_add_seq(self.cache, 0)
        logits, _ = self.step(self.f_prefill, prompt)
        tok = int(np.argmax(logits.numpy()[0, -1]))
        out = [tok]
        for _ in range(n_new - 1):
            t0 = time.perf_counter()
            logits, _ = self.step(self.f_decode, [tok])
            tok = int(np.argmax(logits.numpy()[0, -1]))
            if times is not None:
                times.append(time.perf_counter() - t0)
            out.append(tok)
        self.f_remove_seq(self.cache, 0)
        return out


def dlight_pipeline(target):
    """Default CPU pipeline, plus FuseTransposeMatmul (x @ W.T as one NT_matmul kernel instead of
    materialising W.T every call) and DLight CPU schedule rules (GEMV / Reduction) after legalize/fuse."""
    from tvm.relax.backend.cpu_generic import pipeline as cg
    from tvm.s_tir import dlight as dl

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                [relax.transform.FuseTransposeMatmul()]
                + cg.library_dispatch_passes(target)
                + cg.legalize_passes(target)
                + [dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction())]
                + cg.dataflow_lower_passes(target)
                + cg.finalize_passes(target)
            )
            return seq(mod)

    return _pipeline


def check_inplace_and_kv(gen, hf, prompt, cfg):
    """Prefill the prompt + one decode step, then (1) returned cache is the same object,
    (2) page pool usage, (3) K/V contents in the pages == HF past_key_values, (4) logits diff."""
    f_avail = tvm.get_global_func("vm.builtin.attention_kv_cache_get_num_available_pages")
    avail0 = f_avail(gen.cache)
    gen.f_add_seq(gen.cache, 0)
    h0 = gen.cache.__chandle__()
    logits_p, c1 = gen.step(gen.f_prefill, prompt)
    tok = int(np.argmax(logits_p.numpy()[0, -1]))
    logits_d, c2 = gen.step(gen.f_decode, [tok])
    same = c1.same_as(gen.cache) and c2.same_as(gen.cache) and c2.__chandle__() == h0
    n = len(prompt) + 1
    print(f"[inplace] returned cache is the same object as the input: {same}; "
          f"seq_len={gen.f_seq_len(gen.cache, 0)}; available pages {avail0} -> {f_avail(gen.cache)}")
    L, hkv, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    k = tvm.runtime.tensor(np.zeros((L, n, hkv, d), "float32"), tvm.cpu())
    v = tvm.runtime.tensor(np.zeros((L, n, hkv, d), "float32"), tvm.cpu())
    gen.f_debug_kv(gen.cache, 0, 0, n, k, v)
    with torch.no_grad():
        out = hf(torch.tensor([prompt + [tok]]), use_cache=True)
    pkv = out.past_key_values
    hk = np.stack([pkv.layers[i].keys[0].numpy().transpose(1, 0, 2) for i in range(L)])  # (L, n, hkv, d)
    hv = np.stack([pkv.layers[i].values[0].numpy().transpose(1, 0, 2) for i in range(L)])
    print(f"[kv] max|K_tvm-K_hf|={np.abs(k.numpy() - hk).max():.2e}  "
          f"max|V_tvm-V_hf|={np.abs(v.numpy() - hv).max():.2e}")
    ref_p = out.logits[0, len(prompt) - 1].numpy()
    ref_d = out.logits[0, -1].numpy()
    print(f"[logits] prefill max abs diff {np.abs(logits_p.numpy()[0, -1] - ref_p).max():.2e}, "
          f"decode max abs diff {np.abs(logits_d.numpy()[0, -1] - ref_d).max():.2e}")
    gen.f_remove_seq(gen.cache, 0)


def build(cfg, max_len, page_size, use_dlight=False):
    m = LlamaNN(cfg)
    t0 = time.time()
    mod, params = m.export_tvm(spec=export_spec(m))
    print(f"exported functions: "
          f"{[gv.name_hint for gv in mod.get_global_vars() if isinstance(mod[gv], relax.Function)]}")
    print(f"params: {[n for n, _ in params][:6]} ... ({len(params)})")
    if use_dlight:
        ex = tvm.compile(mod, target=TARGET, relax_pipeline=dlight_pipeline(TARGET))
    else:
        ex = tvm.compile(mod, target=TARGET)  # default relax + tir pipeline for llvm
    print(f"compile time {time.time() - t0:.1f}s")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return m, mod, params, vm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--dlight", action="store_true")
    args = ap.parse_args()
    # the thread count our library would choose here, read (not set): TVM's pool and torch both use it
    threads = use_threads(thread_count())
    torch.set_num_threads(threads)
    print(f"threads: {threads} (aicf_tvm's default on this machine)")
    torch.manual_seed(0)
    if args.big:
        hf_cfg = LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                             intermediate_size=2816, vocab_size=32000, max_position_embeddings=512,
                             tie_word_embeddings=args.tie)
        prompt_len, n_new, max_len, page = 128, 64, 256, 16
    else:
        hf_cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=256, max_position_embeddings=512,
                             tie_word_embeddings=args.tie)
        prompt_len, n_new, max_len, page = 10, 20, 256, 16
    hf = LlamaForCausalLM(hf_cfg).eval()
    if args.tie:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    _, _, params, vm = build(hf_cfg, max_len, page, args.dlight)
    sd = {k: v for k, v in hf.state_dict().items()}
    if args.tie:
        sd.pop("lm_head.weight", None)
    tvm_params = map_hf_weights(sd, params, hf_cfg)

    gen = Generator(vm, tvm_params, max_len, page)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, hf_cfg.vocab_size, size=prompt_len).tolist()

    # --- TVM greedy
    gen.generate(prompt, 3)  # warm-up
    times = []
    t0 = time.perf_counter()
    tvm_tokens = gen.generate(prompt, n_new, times)
    tvm_total = time.perf_counter() - t0

    # --- HF greedy
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hf.generate(ids, max_new_tokens=3, do_sample=False, min_new_tokens=3)  # warm-up
        t0 = time.perf_counter()
        hf_out = hf.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        hf_total = time.perf_counter() - t0
        hf_tokens = hf_out[0, prompt_len:].tolist()
        # HF eager per-token decode timing with its own KV cache (manual loop)
        out = hf(ids, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        hf_times = []
        for _ in range(n_new - 1):
            t1 = time.perf_counter()
            out = hf(tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            hf_times.append(time.perf_counter() - t1)

    check_inplace_and_kv(gen, hf, prompt, hf_cfg)
    print("TVM tokens:", tvm_tokens)
    print("HF  tokens:", hf_tokens)
    print("MATCH:", tvm_tokens == hf_tokens)
    print(f"TVM decode ms/token (median): {1e3 * np.median(times):.2f}  (total gen {tvm_total:.2f}s)")
    print(f"HF  decode ms/token (median, manual loop): {1e3 * np.median(hf_times):.2f}  "
          f"(generate() total {hf_total:.2f}s)")


if __name__ == "__main__":
    main()
