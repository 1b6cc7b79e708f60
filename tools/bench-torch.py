#!/usr/bin/env python3
"""bench-torch: the PyTorch / Hugging Face transformers reference for tandem's CUDA benchmark.

Builds a Llama-3-8B-shaped LlamaForCausalLM from a config (no hub access: random weights, normal
std 0.02, RMSNorm weights 1, untied embeddings) in bf16 on one CUDA device, SDPA attention, eval,
torch.inference_mode(), and measures with CUDA events:
  * decode: one single-token forward step for a whole batch at position --context (default 1024),
    after the cache was filled by a prefill of --context random tokens per sequence (done in
    chunks of positions to bound memory); greedy argmax of the last logits is inside the timed
    region. Every repeat decodes at the same position (the cache is rewound to --context before
    each run, outside the timed region). warm-up 3, repeat 10, median ms.
  * prefill: one sequence (batch 1) of each --prefill length into a fresh cache, logits only for
    the last token (logits_to_keep / num_logits_to_keep, or the base model + lm_head on the last
    hidden state where the forward has neither), greedy argmax timed. warm-up 2, repeat 5, median ms.
A size that runs out of memory is recorded with "ms": null and the error, and the run goes on.
The KV cache is transformers' StaticCache (max_cache_len = context + 1 for decode, = tokens for
prefill) where it can be built and passed to forward (transformers >= 4.42), else DynamicCache;
"cache" in the output says which.

Also checks, once, that the decode path is right: for the first decode batch, the logits of
sequence 0 from the cached decode step against a cache-less forward of the same context + 1
tokens ("check" in the output; reported, not fatal).

usage: tools/bench-torch.py [--json PATH] [--batches 1,8,32,64,128,256] [--context 1024]
                            [--prefill 512,2048,8192] [--layers 32] [--quick]
                            [--warmup 3] [--repeat 10] [--prefill-warmup 2] [--prefill-repeat 5]
                            [--cache auto|static|dynamic] [--seed 0]
  --quick: a smoke test: layers 2, batches 1,8, prefill 512 (explicit options still win).
exit: 0 all sizes ran (or ran out of memory), 1 a size failed otherwise, 2 bad usage,
      77 torch / transformers / CUDA not available (skipped).
Needs: python3 with torch and transformers (4.36 .. 5.x); nothing else, no network.
"""
import argparse
import gc
import inspect
import json
import os
import platform
import statistics
import sys
import time
import traceback

SKIP = 77


def skip(msg):
    print(f"bench-torch: skipped: {msg}", file=sys.stderr)
    sys.exit(SKIP)


if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):  # without torch too
    print(__doc__.strip())
    sys.exit(0)

try:
    import torch
except Exception as e:  # ImportError, or a broken install (missing CUDA libraries...)
    skip(f"torch is not importable ({type(e).__name__}: {e})")


def note(msg):
    print(f"bench-torch: {msg}", file=sys.stderr, flush=True)


def parse_ints(p, s, what):
    try:
        v = [int(x) for x in str(s).replace(" ", "").split(",") if x != ""]
    except ValueError:
        v = []
    if not v or any(x <= 0 for x in v):
        p.error(f"--{what}: expected comma-separated positive integers, got {s!r}")
    return v


def version_tuple(v):
    out = []
    for part in str(v).split("+")[0].split(".")[:3]:
        num = ""
        for ch in part:
            if ch.isdigit():
                num += ch
            else:
                break
        out.append(int(num) if num else 0)
    while len(out) < 3:
        out.append(0)
    return tuple(out)


# ----------------------------------------------------------------------------- model

def make_config(a):
    from transformers import LlamaConfig
    if a.tiny:  # hidden option for quick CPU smoke tests of the code paths
        dims = dict(hidden_size=256, intermediate_size=688, num_attention_heads=8,
                    num_key_value_heads=4, vocab_size=4096)
    else:
        dims = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=128256)
    need = max([8192 + 256, a.context + 1] + list(a.prefill))
    kw = dict(dims, num_hidden_layers=a.layers, head_dim=dims["hidden_size"] // dims["num_attention_heads"],
              max_position_embeddings=need, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
              tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False,
              initializer_range=0.02, use_cache=True, pad_token_id=None, bos_token_id=128000,
              eos_token_id=128001)
    if a.tiny:
        kw.update(bos_token_id=1, eos_token_id=2)
    cfg = LlamaConfig(**kw)
    return cfg


def rope_theta_of(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return rp["rope_theta"]
    return getattr(cfg, "rope_theta", None)


def set_attn(cfg, impl):
    try:
        cfg._attn_implementation = impl
    except Exception:
        pass
    try:
        cfg._attn_implementation_internal = impl
    except Exception:
        pass


def construct(cfg, device, dtype):
    """LlamaForCausalLM(cfg) with its parameters created directly on `device` in `dtype` where torch
    allows it (torch.device context, default dtype), else created on CPU and moved."""
    from transformers import LlamaForCausalLM
    prev = torch.get_default_dtype()
    dtype_set = False
    try:
        try:
            torch.set_default_dtype(dtype)
            dtype_set = True
        except Exception:
            pass
        if device.type != "cpu" and hasattr(torch.device, "__enter__"):
            with device:
                model = LlamaForCausalLM(cfg)
        else:
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    if not dtype_set:
        note(f"torch.set_default_dtype({dtype}) failed; building in {prev} and converting")
    # Convert only what is not already right; keep float32 buffers (rotary inv_freq) in float32.
    keep = {n: b for n, b in model.named_buffers() if b is not None and b.dtype == torch.float32}
    if any(p.dtype != dtype for p in model.parameters()):
        model.to(dtype=dtype)
    if any(p.device != device for p in model.parameters()) or any(
            b.device != device for b in model.buffers() if b is not None):
        model.to(device=device)
    for name, b in keep.items():
        mod_name, _, attr = name.rpartition(".")
        mod = model.get_submodule(mod_name) if mod_name else model
        cur = getattr(mod, attr, None)
        if torch.is_tensor(cur) and cur.dtype != torch.float32:
            mod._buffers[attr] = b.to(device=device, dtype=torch.float32)
    return model


def build_model(a, device, dtype):
    cfg = make_config(a)
    attn = "sdpa"
    try:
        set_attn(cfg, "sdpa")
        model = construct(cfg, device, dtype)
    except (ValueError, ImportError, RuntimeError) as e:
        if device.type == "cuda":
            raise
        # e.g. transformers 4.36 + torch < 2.1.1 (the CPU smoke test): no SDPA there.
        note(f"sdpa attention unavailable here ({type(e).__name__}: {str(e).splitlines()[0][:160]}); using eager")
        attn = "eager"
        cfg = make_config(a)
        set_attn(cfg, "eager")
        model = construct(cfg, device, dtype)
    attn = getattr(model.config, "_attn_implementation", attn) or attn
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)

    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and emb is not None and head.weight.data_ptr() == emb.weight.data_ptr()
    if tied:
        note("lm_head came out tied to the embeddings; untying it")
        head.weight = torch.nn.Parameter(torch.empty_like(emb.weight), requires_grad=False)

    # Our own init, whatever transformers' constructor did (some versions skip or defer it):
    # matrices ~ N(0, 0.02), RMSNorm weights 1. Seeded; never zeros.
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(mean=0.0, std=0.02, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    bad = [n for n, p in model.named_parameters() if p.dtype != dtype or p.device.type != device.type]
    if bad:
        raise RuntimeError(f"parameters not in {dtype} on {device}: {bad[:4]}")
    return model, cfg, attn


# ----------------------------------------------------------------------------- caches

def tf_version():
    import transformers
    return version_tuple(transformers.__version__)


def _first_cache_tensor(cache):
    """The preallocated key tensor of layer 0, or None while the cache is lazily allocated."""
    try:
        kc = getattr(cache, "key_cache", None)
        if isinstance(kc, (list, tuple)) and kc and torch.is_tensor(kc[0]) and kc[0].numel() > 0:
            return kc[0]
    except Exception:
        pass
    layers = getattr(cache, "layers", None)
    if layers:
        k = getattr(layers[0], "keys", None)
        if torch.is_tensor(k) and k.numel() > 0:
            return k
    return None


STATIC_CTOR = []  # the StaticCache constructor form that worked, for the output


def make_static_cache(cfg, batch, max_len, device, dtype):
    """A StaticCache for (batch, max_len), across transformers' constructor signatures, or raises."""
    v = tf_version()
    if v < (4, 42, 0):
        raise RuntimeError(f"transformers {v}: StaticCache cannot be passed to forward before 4.42")
    from transformers import StaticCache
    new = [dict(config=cfg, max_cache_len=max_len),
           dict(config=cfg, max_cache_len=max_len, max_batch_size=batch)]
    old = [dict(config=cfg, max_batch_size=batch, max_cache_len=max_len, device=device, dtype=dtype),
           dict(config=cfg, batch_size=batch, max_cache_len=max_len, device=device, dtype=dtype),
           dict(config=cfg, max_batch_size=batch, max_cache_len=max_len, device=str(device), dtype=dtype)]
    attempts = new + old if v >= (4, 56, 0) else old + new
    errors = []
    for kw in attempts:
        try:
            cache = StaticCache(**kw)
        except (TypeError, ValueError, AttributeError) as e:
            errors.append(f"{sorted(kw)}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            continue
        t = _first_cache_tensor(cache)
        if t is not None and (t.device.type != device.type or t.dtype != dtype or t.shape[0] != batch
                              or t.shape[-2] != max_len):
            errors.append(f"{sorted(kw)}: preallocated {tuple(t.shape)} {t.dtype} on {t.device}")
            del cache, t
            continue
        if not STATIC_CTOR:
            STATIC_CTOR.append("StaticCache(" + ", ".join(sorted(kw)) + ")")
        return cache
    raise RuntimeError("StaticCache could not be built: " + " | ".join(errors))


def make_dynamic_cache(cfg):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=cfg)
    except TypeError:
        return DynamicCache()


def seq_len(cache):
    n = cache.get_seq_length()
    return int(n.item()) if torch.is_tensor(n) else int(n)


def rewind(cache, kind, n):
    """Makes the cache hold the first n positions again (outside timed regions). Static caches whose
    write position is a counter (transformers 5.x: cumulative_length) get the counter set to n; older
    static caches write at cache_position and need nothing. Dynamic caches are sliced to n."""
    tracked = False
    layers = getattr(cache, "layers", None)
    if layers:
        for layer in layers:
            if kind == "dynamic":
                for attr in ("keys", "values"):
                    t = getattr(layer, attr, None)
                    if torch.is_tensor(t) and t.dim() >= 2 and t.shape[-2] > n:
                        setattr(layer, attr, t[..., :n, :])
            for attr in ("cumulative_length", "cumulative_length_int"):
                if hasattr(layer, attr):
                    cur = getattr(layer, attr)
                    if torch.is_tensor(cur):
                        cur.fill_(n)
                    else:
                        setattr(layer, attr, n)
                    tracked = True
    elif kind == "dynamic":
        for name in ("key_cache", "value_cache"):
            lst = getattr(cache, name, None)
            if isinstance(lst, list):
                for i, t in enumerate(lst):
                    if torch.is_tensor(t) and t.dim() >= 2 and t.shape[-2] > n:
                        lst[i] = t[..., :n, :]
    if kind == "dynamic":
        inst = vars(cache)  # plain instance attributes only (seen_tokens is a read-only property in 4.4x)
        for attr in ("_seen_tokens", "seen_tokens"):
            if isinstance(inst.get(attr), int):
                inst[attr] = n
        tracked = True
    if tracked and n > 0:
        got = seq_len(cache)
        if got != n:
            raise RuntimeError(f"cache rewind to {n} failed: get_seq_length() = {got}")


# ----------------------------------------------------------------------------- forward helpers

class Runner:
    def __init__(self, model, device, logits_kw_override=None):
        self.model = model
        self.device = device
        params = inspect.signature(model.forward).parameters
        base_params = inspect.signature(model.model.forward).parameters
        self.cache_position = "cache_position" in params
        self.base_cache_position = "cache_position" in base_params
        if "logits_to_keep" in params:
            self.logits_kw = "logits_to_keep"
        elif "num_logits_to_keep" in params:
            self.logits_kw = "num_logits_to_keep"
        else:
            self.logits_kw = None
        self.logits_mode = self.logits_kw or "manual (base model + lm_head on the last hidden state)"

    def _kw(self, ids, cache, start, base):
        b, t = ids.shape
        pos = torch.arange(start, start + t, device=self.device, dtype=torch.long)
        kw = dict(input_ids=ids, position_ids=pos.unsqueeze(0).expand(b, t).contiguous())
        if cache is not None:
            kw.update(past_key_values=cache, use_cache=True)
        else:
            kw.update(use_cache=False)
        if (self.base_cache_position if base else self.cache_position):
            kw["cache_position"] = pos
        return kw

    def fill(self, ids, cache, start):
        """Base model only (no lm_head): writes positions start.. of ids into the cache."""
        self.model.model(**self._kw(ids, cache, start, base=True))

    def last_logits(self, ids, cache, start):
        """Logits of the last position, [batch, vocab], computing the lm_head for that position only."""
        if self.logits_kw is not None or ids.shape[1] == 1:
            kw = self._kw(ids, cache, start, base=False)
            if self.logits_kw is not None:
                kw[self.logits_kw] = 1
            out = self.model(**kw)
            logits = out.logits if hasattr(out, "logits") else out[0]
            return logits[:, -1, :]
        out = self.model.model(**self._kw(ids, cache, start, base=True))
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.model.lm_head(h[:, -1:, :])[:, -1, :]

    def greedy(self, ids, cache, start):
        return self.last_logits(ids, cache, start).argmax(dim=-1)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_runs(device, fn, before, warmup, repeat):
    """ms of each of `repeat` runs of fn() after `warmup` untimed ones; before() runs untimed first."""
    for _ in range(warmup):
        before()
        fn()
    sync(device)
    runs = []
    for _ in range(repeat):
        before()
        sync(device)
        if device.type == "cuda":
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            runs.append(float(s.elapsed_time(e)))
        else:
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
    return runs


def new_cache(st, cfg, batch, max_len, device, dtype):
    """(cache, kind) with the kind chosen for the run (st['cache']); 'auto' settles on the first call."""
    if st["cache"] in ("auto", "static"):
        try:
            return make_static_cache(cfg, batch, max_len, device, dtype), "static"
        except Exception as e:
            if st["cache"] == "static" or is_oom(e):
                raise
            note(f"StaticCache unavailable, using DynamicCache: {str(e)[:400]}")
            st["cache"] = "dynamic"
            st["cache_note"] = str(e)[:400]
    return make_dynamic_cache(cfg), "dynamic"


# ----------------------------------------------------------------------------- benchmarks

def bench_decode(a, st, model, cfg, run, device, dtype, batch, check):
    ctx = a.context
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed + 1000 + batch)
    vocab = cfg.vocab_size
    prompt = torch.randint(0, vocab, (batch, ctx), device=device, generator=gen)
    nxt = torch.randint(0, vocab, (batch, 1), device=device, generator=gen)
    cache, kind = new_cache(st, cfg, batch, ctx + 1, device, dtype)
    chunk = max(1, min(ctx, a.fill_tokens // batch))
    for s in range(0, ctx, chunk):
        run.fill(prompt[:, s:s + chunk], cache, s)
    sync(device)
    if kind == "dynamic" or seq_len_tracked(cache):
        got = seq_len(cache)
        if got != ctx:
            raise RuntimeError(f"after filling {ctx} positions the cache holds {got}")
    runs = timed_runs(device, lambda: run.greedy(nxt, cache, ctx), lambda: rewind(cache, kind, ctx),
                      a.warmup, a.repeat)
    res = {"batch": batch, "context": ctx, "ms": statistics.median(runs), "runs": [round(r, 4) for r in runs]}
    if check:
        what = "decode logits of sequence 0 vs a cache-less forward of its context+1 tokens"
        try:
            rewind(cache, kind, ctx)
            dec = run.last_logits(nxt, cache, ctx)[0].float()
            del cache
            full_ids = torch.cat([prompt[:1], nxt[:1]], dim=1)
            ref = run.last_logits(full_ids, None, 0)[0].float()
            rel = float((dec - ref).norm() / ref.norm().clamp_min(1e-30))
            st["check"] = {"batch": batch, "context": ctx, "what": what, "rel_err": rel,
                           "argmax_match": bool(int(dec.argmax()) == int(ref.argmax()))}
            tol = 1e-3 if dtype == torch.float32 else 0.05
            if not rel <= tol:
                note(f"WARNING: decode check: rel err {rel:.3g} > {tol} (cache positions may be wrong)")
        except Exception as e:  # the timing stands; the check is reported as not done
            msg = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            note(f"WARNING: decode check failed to run: {msg}")
            st["check"] = {"batch": batch, "context": ctx, "what": what, "error": msg}
    return res


def seq_len_tracked(cache):
    layers = getattr(cache, "layers", None)
    return bool(layers) and any(hasattr(l, "cumulative_length") for l in layers)


def bench_prefill(a, st, model, cfg, run, device, dtype, tokens):
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed + 2000 + tokens)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), device=device, generator=gen)
    holder = {}
    if st["cache"] == "dynamic":
        def before():
            holder["cache"] = None
            holder["cache"] = make_dynamic_cache(cfg)
        kind = "dynamic"
    else:
        cache, kind = new_cache(st, cfg, 1, tokens, device, dtype)
        holder["cache"] = cache
        if kind == "dynamic":
            def before():
                holder["cache"] = None
                holder["cache"] = make_dynamic_cache(cfg)
        else:
            def before():
                rewind(holder["cache"], "static", 0)
    runs = timed_runs(device, lambda: run.greedy(ids, holder["cache"], 0), before,
                      a.prefill_warmup, a.prefill_repeat)
    holder.clear()
    return {"tokens": tokens, "ms": statistics.median(runs), "runs": [round(r, 4) for r in runs]}


def is_oom(e):
    oom_t = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_t is not None and isinstance(e, oom_t):
        return True
    return isinstance(e, (RuntimeError, MemoryError)) and "out of memory" in str(e).lower()


def cleanup(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def guarded(device, fn, failed):
    """(result, error string); on OOM or another error records it and frees memory."""
    err = None
    res = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001 -- each size is independent
        if is_oom(e):
            err = "out of memory: " + str(e).splitlines()[0][:300]
        else:
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            traceback.print_exc()
            failed.append(err)
        note(f"  {err}")
        e = None  # drop the traceback (and the tensors its frames hold) before freeing
    if res is not None and device.type == "cuda":
        res["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    cleanup(device)
    return res, err


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench-torch.py",
                                description="PyTorch/transformers reference timings for a Llama-3-8B-shaped model.")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    p.add_argument("--batches", default=None, help="decode batch sizes (default 1,8,32,64,128,256)")
    p.add_argument("--context", type=int, default=None, help="decode context length (default 1024)")
    p.add_argument("--prefill", default=None, help="prefill lengths, batch 1 (default 512,2048,8192)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 32)")
    p.add_argument("--quick", action="store_true", help="smoke test: layers 2, batches 1,8, prefill 512")
    p.add_argument("--warmup", type=int, default=3, help="decode warm-up runs (default 3)")
    p.add_argument("--repeat", type=int, default=10, help="decode timed runs (default 10)")
    p.add_argument("--prefill-warmup", type=int, default=2, help="prefill warm-up runs (default 2)")
    p.add_argument("--prefill-repeat", type=int, default=5, help="prefill timed runs (default 5)")
    p.add_argument("--cache", choices=("auto", "static", "dynamic"), default="auto",
                   help="KV cache class (default auto: StaticCache, else DynamicCache)")
    p.add_argument("--fill-tokens", type=int, default=16384,
                   help="at most batch*chunk tokens per forward when filling the decode cache (default 16384)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and token ids (default 0)")
    p.add_argument("--no-check", action="store_true", help="skip the decode-vs-full-forward check")
    # Hidden: smoke tests on a machine without a GPU.
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.layers = 2 if a.layers is None else a.layers
        a.batches = "1,8" if a.batches is None else a.batches
        a.prefill = "512" if a.prefill is None else a.prefill
    a.layers = 32 if a.layers is None else a.layers
    a.context = 1024 if a.context is None else a.context
    a.batches = parse_ints(p, "1,8,32,64,128,256" if a.batches is None else a.batches, "batches")
    a.prefill = parse_ints(p, "512,2048,8192" if a.prefill is None else a.prefill, "prefill")
    for name in ("layers", "context", "repeat", "prefill_repeat", "fill_tokens"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("warmup", "prefill_warmup"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    return a


def main(argv):
    a = parse_args(argv)
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401
    except Exception as e:
        skip(f"transformers is not importable ({type(e).__name__}: {e})")
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            skip(f"CUDA is not available to torch {torch.__version__}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        dtype = torch.bfloat16
        dev_name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        dtype = torch.float32
        dev_name = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"
    else:
        print(f"bench-torch: unsupported --device {a.device}", file=sys.stderr)
        return 2
    try:
        transformers.logging.set_verbosity_error()
    except Exception:
        pass
    torch.manual_seed(a.seed)

    t0 = time.perf_counter()
    model, cfg, attn = build_model(a, device, dtype)
    sync(device)
    build_s = time.perf_counter() - t0
    run = Runner(model, device)
    n_params = sum(p.numel() for p in model.parameters())
    note(f"model: {a.layers} layers, {n_params / 1e9:.3f} B params, {dtype}, attn {attn}, "
         f"built in {build_s:.1f} s on {dev_name}; logits: {run.logits_mode}")

    st = {"cache": a.cache, "cache_note": None, "check": None, "settled": False}
    failed = []
    decode, prefill = [], []
    with torch.inference_mode():
        for i, b in enumerate(a.batches):
            note(f"decode batch {b} context {a.context} ...")
            nfail = len(failed)
            res, err = guarded(device, lambda: bench_decode(a, st, model, cfg, run, device, dtype, b,
                                                            check=(i == 0 and not a.no_check)), failed)
            if res is None and st["cache"] == "auto" and not st["settled"] and len(failed) > nfail:
                # StaticCache was built but this transformers cannot run it as we call it: retry dynamic.
                note("StaticCache failed in the forward; retrying with DynamicCache")
                st["cache"], st["cache_note"] = "dynamic", f"StaticCache failed: {err}"
                del failed[nfail:]
                res, err = guarded(device, lambda: bench_decode(a, st, model, cfg, run, device, dtype, b,
                                                                check=(i == 0 and not a.no_check)), failed)
            if res is not None:
                st["settled"] = True
            if res is None:
                res = {"batch": b, "context": a.context, "ms": None, "runs": [], "error": err}
            else:
                note(f"  {res['ms']:.3f} ms")
            decode.append(res)
        for t in a.prefill:
            note(f"prefill {t} tokens ...")
            res, err = guarded(device, lambda: bench_prefill(a, st, model, cfg, run, device, dtype, t), failed)
            if res is None:
                res = {"tokens": t, "ms": None, "runs": [], "error": err}
            else:
                note(f"  {res['ms']:.3f} ms")
            prefill.append(res)

    cache_kind = st["cache"] if st["cache"] != "auto" else "static"
    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": dev_name,
        "cuda": getattr(torch.version, "cuda", None),
        "dtype": str(dtype).replace("torch.", ""),
        "attn": attn,
        "cache": cache_kind,
        "cache_note": st["cache_note"],
        "cache_ctor": STATIC_CTOR[0] if STATIC_CTOR and cache_kind == "static" else None,
        "logits": run.logits_mode,
        "layers": a.layers,
        "params": n_params,
        "model": {"hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "vocab": cfg.vocab_size, "rope_theta": rope_theta_of(cfg), "rms_norm_eps": cfg.rms_norm_eps,
                  "max_position_embeddings": cfg.max_position_embeddings, "tiny": bool(a.tiny)},
        "timing": {"decode_warmup": a.warmup, "decode_repeat": a.repeat, "prefill_warmup": a.prefill_warmup,
                   "prefill_repeat": a.prefill_repeat, "clock": "cuda events" if device.type == "cuda"
                   else "perf_counter", "stat": "median"},
        "build_s": round(build_s, 2),
        "check": st["check"],
        "decode": decode,
        "prefill": prefill,
        "errors": failed,
    }
    if a.json:
        d = os.path.dirname(os.path.abspath(a.json))
        os.makedirs(d, exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")

    def fmt(x, w, p=3):
        return f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}}"

    print(f"torch {out['torch']} | transformers {out['transformers']} | {dev_name} | {out['dtype']} | "
          f"attn {attn} | cache {cache_kind} | layers {a.layers} | {n_params / 1e9:.2f} B params")
    print(f"decode (context {a.context}, one step, median of {a.repeat}):")
    print(f"  {'batch':>6} {'ms':>10} {'tok/s':>12}")
    for r in decode:
        tps = r["batch"] / r["ms"] * 1e3 if r["ms"] else None
        print(f"  {r['batch']:>6} {fmt(r['ms'], 10)} {fmt(tps, 12, 1)}" + (f"  {r['error']}" if r.get("error") else ""))
    print(f"prefill (batch 1, median of {a.prefill_repeat}):")
    print(f"  {'tokens':>6} {'ms':>10} {'tok/s':>12}")
    for r in prefill:
        tps = r["tokens"] / r["ms"] * 1e3 if r["ms"] else None
        print(f"  {r['tokens']:>6} {fmt(r['ms'], 10)} {fmt(tps, 12, 1)}" + (f"  {r['error']}" if r.get("error") else ""))
    if st["check"] and "error" in st["check"]:
        print(f"check: decode vs cache-less forward: not done ({st['check']['error']})")
    elif st["check"]:
        c = st["check"]
        print(f"check: decode vs cache-less forward (batch {c['batch']}, seq 0): rel err {c['rel_err']:.3g}, "
              f"argmax {'match' if c['argmax_match'] else 'DIFFERS'}")
    if a.json:
        print(f"wrote {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
