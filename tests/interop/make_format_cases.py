"""Writes the files of tests/interop/formats_case.sh with whichever torch runs it (Debian's 1.13
or the cached torch 2.x environment), plus a JSON of what each must hold.

usage: make_format_cases.py OUT_DIR [pt|hf]   (pt: all but hf/; hf: only hf/; default both)
  dtypes.pt        every dtype this torch has and shardckpt supports (float8 and uint16/32/64
                   only from torch 2.1 on), written by torch.save
  lists.pt         tensors inside lists and tuples, and ints, strings, floats, None beside them;
                   a module's and an optimizer's state dicts (int keys) nested in dicts
  legacy.pt        the pre-1.6 format (_use_new_zipfile_serialization=False)
  legacy_p1.pt, legacy_p3.pt, legacy_p4.pt, legacy_p5.pt   the same at those pickle protocols
  tied.pt          two names sharing one tensor (tied embeddings), keys in an unsorted order
  proto1.pt, proto4.pt   torch.save with pickle_protocol 1 (refused by name) and 4
  quantized.pt, quantized_channel.pt   quantized tensors (refused naming the tensor and dtype)
  sparse.pt        a sparse COO tensor (refused naming the tensor and its layout)
  empty_name.safetensors, u16.safetensors, c64.safetensors   (torch 2.x only: safetensors)
  hf/              a tiny randomly initialised Llama save_pretrained in shards (torch 2.x only)
  hf_bin/          the same as a sharded torch.save set, as transformers 4 wrote one (torch 2.x only)
"""
import collections
import json
import os
import sys

import torch


def dtypes():
    g = torch.Generator().manual_seed(11)
    sd = collections.OrderedDict()
    sd["zf32"] = torch.randn(7, 5, generator=g)
    sd["f64"] = torch.randn(3, 4, generator=g, dtype=torch.float64)
    sd["f16"] = torch.randn(9, generator=g).half()
    sd["bf16"] = torch.randn(2, 6, generator=g).bfloat16()
    sd["i64"] = torch.randint(-2**40, 2**40, (5,), generator=g)
    sd["i32"] = torch.randint(-2**30, 2**30, (4,), generator=g, dtype=torch.int32)
    sd["i16"] = torch.randint(-2**14, 2**14, (4,), generator=g, dtype=torch.int16)
    sd["i8"] = torch.randint(-128, 127, (6,), generator=g, dtype=torch.int8)
    sd["u8"] = torch.randint(0, 255, (6,), generator=g, dtype=torch.uint8)
    sd["mask"] = torch.rand(5, generator=g) > 0.5
    sd["c64"] = torch.complex(torch.randn(3, 2, generator=g), torch.randn(3, 2, generator=g))
    sd["c128"] = torch.complex(torch.randn(4, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64))
    if hasattr(torch, "float8_e4m3fn"):
        sd["f8e4m3"] = torch.randn(4, 8, generator=g).to(torch.float8_e4m3fn)
        sd["f8e5m2"] = torch.randn(4, 8, generator=g).to(torch.float8_e5m2)
        # The unsigned types have few kernels: built from int64 bit patterns.
        sd["u16"] = torch.tensor([0, 1, 40000, 65535], dtype=torch.int32).to(torch.uint16)
        sd["u32"] = torch.tensor([0, 1, 2**31 + 5, 2**32 - 1], dtype=torch.int64).to(torch.uint32)
        sd["u64"] = torch.tensor([0, 1, 2**40, -1], dtype=torch.int64).view(torch.uint64)
        sd["f8view"] = sd["f8e4m3"][1:3, ::2]  # a strided view into a float8 UntypedStorage
    return sd


def lists():
    g = torch.Generator().manual_seed(12)
    sd = collections.OrderedDict()
    sd["w"] = torch.randn(3, generator=g)
    sd["lst"] = [torch.randn(2, 2, generator=g), torch.arange(5)]
    sd["opt"] = {"steps": [torch.tensor(1.0), {"m": torch.ones(3)}], "lr": 0.125}
    sd["tup"] = (torch.zeros(2, dtype=torch.int32), torch.ones(1))
    sd["epoch"] = 42
    sd["name"] = "run-7"
    sd["nothing"] = None
    sd["flags"] = [1, 2, "x", 2 ** 70, -2 ** 65]
    # Protocol 2 pickles bytes through _codecs.encode (b"" as bytes()), 3 and up as BINBYTES.
    sd["raw"] = [b"\x00\xffab\x80", b""]
    # A training checkpoint's nesting: a module's dotted keys inside a dict, an optimizer's state
    # by parameter number (int keys), its param groups a value.
    sd["model"] = {"layers.0.weight": torch.randn(2, 3, generator=g)}
    sd["optim"] = {"state": {0: {"exp_avg": torch.randn(2, 3, generator=g), "step": torch.tensor(3.0)},
                             1: {"exp_avg": torch.randn(4, generator=g), "step": torch.tensor(3.0)}},
                   "param_groups": [{"lr": 0.5, "params": [0, 1]}]}
    return sd


def tied():
    g = torch.Generator().manual_seed(13)
    emb = torch.randn(10, 4, generator=g)
    sd = collections.OrderedDict()
    sd["model.embed.weight"] = emb
    sd["model.norm.weight"] = torch.ones(4)
    sd["lm_head.weight"] = emb  # tied: the same tensor under a second name
    sd["a.bias"] = torch.zeros(4)
    return sd


def write_torch_set(transformers, config, out):
    """The set transformers 4 wrote with save_pretrained(safe_serialization=False), which 5.x no
    longer writes: pytorch_model-0000k-of-0000n.bin shards (torch.save of flat state dicts) and
    pytorch_model.bin.index.json, names in sorted order; tied embeddings share one storage in one
    shard, lm_head.weight listed before the embedding it shares."""
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    state = transformers.LlamaForCausalLM(config).state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    names = sorted(state)
    shards = [names[i::3] for i in range(3)]
    for shard in shards:  # the tied pair in one shard, as torch.save keeps a shared storage
        if "model.embed_tokens.weight" in shard:
            shard.remove("model.embed_tokens.weight")
    shards[[i for i, s in enumerate(shards) if "lm_head.weight" in s][0]].append("model.embed_tokens.weight")
    os.makedirs(out, exist_ok=True)
    weight_map = {}
    for k, shard in enumerate(shards):
        file = "pytorch_model-%05d-of-%05d.bin" % (k + 1, len(shards))
        torch.save({name: state[name] for name in shard}, os.path.join(out, file))
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
              open(os.path.join(out, "pytorch_model.bin.index.json"), "w"), indent=2)


def main():
    out = sys.argv[1]
    part = sys.argv[2] if len(sys.argv) > 2 else "all"
    os.makedirs(out, exist_ok=True)
    info = {"torch": torch.__version__, "float8": hasattr(torch, "float8_e4m3fn")}
    if part != "hf":
        write_files(out, info)
    if part != "pt":
        try:
            import transformers
            config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                              tie_word_embeddings=False)
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(config)
            model.save_pretrained(os.path.join(out, "hf"), max_shard_size="20KB")
            info["transformers"] = transformers.__version__
            write_torch_set(transformers, config, os.path.join(out, "hf_bin"))
        except ImportError:
            pass
    json.dump(info, open(os.path.join(out, "info.json"), "w"))
    print("wrote format cases with torch", torch.__version__)


def write_files(out, info):
    torch.save(dtypes(), os.path.join(out, "dtypes.pt"))
    torch.save(lists(), os.path.join(out, "lists.pt"))
    torch.save(tied(), os.path.join(out, "tied.pt"))
    legacy = collections.OrderedDict((k, v) for k, v in dtypes().items() if k in ("zf32", "f64", "bf16", "i64", "mask"))
    base = torch.arange(12, dtype=torch.float32).view(3, 4)
    legacy["view.t"] = base.t()
    legacy["view.base"] = base
    legacy["epoch"] = 3
    torch.save(legacy, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    for protocol in (1, 3, 4, 5):
        torch.save(legacy, os.path.join(out, "legacy_p%d.pt" % protocol), pickle_protocol=protocol,
                   _use_new_zipfile_serialization=False)
    torch.save(tied(), os.path.join(out, "proto1.pt"), pickle_protocol=1)
    quantized = collections.OrderedDict(w=torch.ones(2))
    quantized["q"] = torch.quantize_per_tensor(torch.linspace(-1, 1, 8), 0.1, 3, torch.qint8)
    quantized["qc"] = torch.quantize_per_channel(torch.ones(2, 3), torch.tensor([0.5, 0.25]), torch.tensor([0, 1]), 0,
                                                 torch.quint8)
    torch.save(quantized, os.path.join(out, "quantized.pt"))
    torch.save({"qc": quantized["qc"]}, os.path.join(out, "quantized_channel.pt"))
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    torch.save(collections.OrderedDict(w=torch.ones(2), s=sparse), os.path.join(out, "sparse.pt"))
    torch.save(lists(), os.path.join(out, "proto4.pt"), pickle_protocol=4)
    try:
        import safetensors.torch
        safetensors.torch.save_file({"": torch.ones(2), "b": torch.zeros(3)}, os.path.join(out, "empty_name.safetensors"))
        safetensors.torch.save_file({"u": torch.tensor([1, 65535], dtype=torch.int32).to(torch.uint16)},
                                    os.path.join(out, "u16.safetensors"))
        safetensors.torch.save_file({"c": torch.complex(torch.ones(2), torch.zeros(2))}, os.path.join(out, "c64.safetensors"))
        info["safetensors"] = safetensors.__version__
    except ImportError:
        pass


if __name__ == "__main__":
    main()
