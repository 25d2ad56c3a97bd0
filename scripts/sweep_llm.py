"""Greedy tokens of ``compile_causal_lm`` against transformers' ``generate`` on small
random decoders of many families (2 layers, hidden 64): the families E17 names and the
decoders a user is likely to try next. Prints one row per family: equal / differs /
refused (with our error), and the compile seconds.

    python -m scripts.sweep_llm [--families llama gpt2 ...] [--prompt 6] [--steps 20] [--json out.json]
                                [--weights int8|int4]

``--prompt 40``: prompts of several attention row tiles (the prefill's masked keys skipped,
a sliding window shorter than the prompt).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}


def configs() -> dict:
    import transformers as t

    return {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**SMALL)),
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**SMALL, sliding_window=None)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**SMALL)),
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**SMALL, head_dim=16)),
        "gemma": lambda: t.GemmaForCausalLM(t.GemmaConfig(**SMALL, head_dim=16)),
        "gemma2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(**SMALL, head_dim=16, sliding_window=16)),
        "phi": lambda: t.PhiForCausalLM(t.PhiConfig(**SMALL)),
        "phi3": lambda: t.Phi3ForCausalLM(t.Phi3Config(**SMALL, pad_token_id=0, eos_token_id=2, bos_token_id=1)),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                                       n_positions=256)),
        "gpt_neox": lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**{k: v for k, v in SMALL.items()
                                                                     if k != "num_key_value_heads"})),
        "olmo": lambda: t.OlmoForCausalLM(t.OlmoConfig(**SMALL)),
        "stablelm": lambda: t.StableLmForCausalLM(t.StableLmConfig(**SMALL)),
        "granite": lambda: t.GraniteForCausalLM(t.GraniteConfig(**SMALL)),
        "opt": lambda: t.OPTForCausalLM(t.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                    num_attention_heads=4, vocab_size=256,
                                                    max_position_embeddings=256, word_embed_proj_dim=64)),
        "bloom": lambda: t.BloomForCausalLM(t.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=256)),
        "falcon": lambda: t.FalconForCausalLM(t.FalconConfig(hidden_size=64, num_hidden_layers=2,
                                                             num_attention_heads=4, vocab_size=256)),
    }


def main() -> None:
    import torch

    import aicf_tvm
    from tests.helpers import rounded_copy

    table = configs()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", default=list(table))
    parser.add_argument("--prompt", type=int, default=6, help="prompt tokens per sequence (2 sequences)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--weights", choices=("float32", "int8", "int4"), default="float32",
                        help="int8 / int4: compile with those weights and compare with the model whose linear "
                             "weights numpy rounded so (tests.helpers.rounded_copy)")
    args = parser.parse_args()
    rows = []
    for family in args.families:
        torch.manual_seed(0)
        try:
            model = table[family]().eval()
        except (AttributeError, ValueError, TypeError) as err:  # a family or config this transformers lacks
            rows.append({"family": family, "result": f"not built: {str(err).splitlines()[0][:100]}"})
            print(f"{family:10} not built: {err}", flush=True)
            continue
        prompt = np.random.default_rng(1).integers(3, 256, (2, args.prompt))
        start = time.perf_counter()
        try:
            lm = aicf_tvm.compile_causal_lm(model, max_length=args.prompt + args.steps, weights=args.weights,
                                            activations="float32")  # the reference rounds weights only
        except aicf_tvm.AicfError as err:
            rows.append({"family": family, "result": "refused", "error": str(err)[:300]})
            print(f"{family:10} refused: {str(err)[:300]}", flush=True)
            continue
        secs = time.perf_counter() - start
        if args.weights != "float32":
            model = rounded_copy(model, args.weights)
        with torch.no_grad():
            want = model.generate(torch.from_numpy(prompt), max_new_tokens=args.steps, do_sample=False,
                                  eos_token_id=None, pad_token_id=0).numpy()
        got = lm.generate(prompt, max_new_tokens=args.steps, stop_tokens=[])
        result = "equal" if np.array_equal(got, want) else "differs"
        rows.append({"family": family, "result": result, "compile_s": round(secs, 1)})
        print(f"{family:10} {result:8} compile {secs:5.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
