"""A real vLLM worker on CPU for tests/engines/vllm-e2e.sh and vllm-bench.sh.

    python vllm_worker.py model DIR [--layers N]   # a tiny Llama with random weights, no hub
    python vllm_worker.py generate DIR             # vLLM's LLM(...).generate, greedy

`generate` prints one line `RESULT {json}`: the generated token ids and torch's cache counters
(the engine core runs in this process with VLLM_ENABLE_V1_MULTIPROCESSING=0, so
`torch._dynamo.utils.counters` are the engine's own). vLLM's own log says how long "init engine"
took. JITSHIP_TEST_DTYPE (default bfloat16) makes another model config of the same weights.
"""

import json
import os
import sys


def make_model(path, layers):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    words = ["cache", "kernel", "compile", "worker", "store", "graph", "token", "model"]
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 9 + 3)) for i in range(4000)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(path)


def generate(path):
    from vllm import LLM, SamplingParams

    # Another dtype is another model config (another vLLM hash, other kernels).
    dtype = os.environ.get("JITSHIP_TEST_DTYPE", "bfloat16")
    llm = LLM(model=path, dtype=dtype, max_model_len=256, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = ["cache kernel compile", "worker store graph token"]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    from torch._dynamo.utils import counters

    print(
        "RESULT "
        + json.dumps(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "inductor": dict(counters["inductor"]),
                "aot_autograd": dict(counters["aot_autograd"]),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    if sys.argv[1] == "model":
        layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else 2
        make_model(sys.argv[2], layers)
    elif sys.argv[1] == "generate":
        generate(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
