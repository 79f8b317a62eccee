"""Find, check, fingerprint and train tokenizers (`tokenizers` JSON format).

`TOK` on the command line is a tokenizer.json, a folder holding one, or a hub name such as
``gpt2``. Whatever it was, the file is copied beside the manifest and identified by its
sha256, so a prepared folder says exactly which vocabulary made it.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from pipeline.encoding import byte_level
from pipeline.encoding.bos import AUTO_BOS, NO_BOS, find_bos
from pipeline.encoding.interruptible import interruptible
from pipeline.format import lfs_pointer
from pipeline.format.atomic import (
    DiskFullError,
    check_writable_dir,
    holder_text,
    missing_folders,
    release_lock,
    take_back_folders,
    take_lock,
    write_durable,
    write_json,
)
from pipeline.format.content_hash import sha256_file
from pipeline.format.errors import DataError, TokshardError, counted, out_of_range, utf8_path
from pipeline.format.file_kind import not_a_file
from pipeline.format.token_dtypes import TOKEN_DTYPES

TOKENIZER_FILE = "tokenizer.json"
#: the file a model's hub folder keeps beside its tokenizer.json, naming its EOS
CONFIG_FILE = "tokenizer_config.json"
#: held (a POSIX lock) by the `tokshard tokenizer train` writing into its --out, and naming it
TRAIN_LOCK = ".tokshard-tokenizer.lock"
DEFAULT_EOS = "<|endoftext|>"
#: EOS spellings tried in order when a recipe does not name one: the end of a document in the
#: published families (GPT-2, GPT-4 and Qwen; Llama 2 and Mistral; Llama 3; Gemma; DeepSeek;
#: Command R), which a chat model's tokenizer_config.json may name otherwise (its end of turn)
EOS_CANDIDATES = (
    DEFAULT_EOS,
    "</s>",
    "<|end_of_text|>",
    "<eos>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<EOS_TOKEN>",
    "<|eos|>",
    "[SEP]",
)
UINT16_LIMIT = 1 << 16
#: the longest word `tokshard tokenizer train` learns from whole unless told (``--max-token-length``),
#: in characters, and so its longest token (a leading space aside): ordinary text has no longer
#: word (the longest in bench/corpus.py's text, tables and indented code included, is 130), so its
#: vocabulary is the one training without a bound learns (bench/corpus.py's 5 MB at 8,000 ids:
#: the same bytes); a longer word (DNA, base64, minified data) is learned from in pieces this long
DEFAULT_MAX_TOKEN_LENGTH = 256
#: the largest ``--max-token-length``: the pieces are cut by a regex repeat, which Oniguruma
#: (`tokenizers`' regex engine) bounds at 100,000
MAX_TOKEN_LENGTH_LIMIT = 100_000
#: the smallest and largest ``--max-token-length`` (one character is no pair to merge)
TOKEN_LENGTHS = (2, MAX_TOKEN_LENGTH_LIMIT)
#: the smallest and largest ``--vocab-size``: the 256 bytes and EOS, and what a shard's token
#: dtype holds
VOCAB_SIZES = (257, 4 * UINT16_LIMIT)
#: seconds between the lines that say how much training has read (where no bar shows it)
READING_INTERVAL = 30.0


@dataclass(frozen=True)
class TokenizerInfo:
    """Facts the manifest records and every worker checks."""

    path: str
    sha256: str
    vocab_size: int
    eos_id: int
    eos_token: str
    origin: str
    #: the token dtype the run writes, and why (``--dtype auto`` decides from ``vocab_size``)
    dtype: str = "uint16"
    dtype_reason: str = ""
    #: how the EOS was found, and why no document's text encodes to its id
    eos_found: str = ""
    #: the token written before each document (`pipeline.encoding.bos`), None for none, and why
    bos_id: int | None = None
    bos_token: str | None = None
    bos_found: str = ""
    #: the tokenizer's own BOS, where the run leaves it out by default
    bos_unused: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: tiktoken's encoding names (a user of tiktoken types these), each with a hub repo whose
#: tokenizer.json encodes as it does, where one is known (GPT-2's 50k is r50k_base)
TIKTOKEN_ENCODINGS = {
    "cl100k_base": "Xenova/gpt-4",
    "o200k_base": "Xenova/gpt-4o",
    "r50k_base": "openai-community/gpt2",
    "p50k_base": None,
    "p50k_edit": None,
    "o200k_harmony": None,
}


def locate(spec: str, revision: str | None = None) -> Path:
    """Turn TOK into a local tokenizer.json (downloading a hub name through the hub cache)."""
    from pipeline.storage.locations import refuse_url

    refuse_url(spec, "tokenizer")
    path = Path(spec).expanduser()
    if path.is_file():
        return _starts_as_json(path)
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return _starts_as_json(path / TOKENIZER_FILE)
        raise TokshardError(f"tokenizer folder {path} holds no {TOKENIZER_FILE}; {foreign_hint(path)}")
    other = not_a_file(path)
    if other != "missing":  # a pipe (`<(...)`), a device, a socket: here, so never a hub name
        raise TokshardError(
            f"tokenizer {spec} is {other}, not a file; pass a tokenizer.json, or a folder holding one"
        )
    if path.is_symlink():  # it exists, and leads nowhere: a local path, never a hub name
        raise TokshardError(
            f"tokenizer {spec} is a symbolic link to {os.readlink(path)}, which does not exist; "
            "fix the link, or pass the tokenizer.json itself"
        )
    looks_local = spec.startswith((".", "/", "~")) or spec.endswith(".json") or spec.count("/") > 1
    if looks_local:
        raise TokshardError(
            f"no tokenizer at {spec}"
            + ("" if path.is_absolute() else f" (looked for from {Path.cwd()}, where tokshard runs)")
            + "; pass a tokenizer.json, a folder holding one, or a hub name"
        )
    if spec in TIKTOKEN_ENCODINGS:  # no hub repo has such a name: say what to pass instead
        copy = TIKTOKEN_ENCODINGS[spec]
        instead = f"pass the hub's copy of it (--tokenizer {copy}), or" if copy else "pass"
        raise TokshardError(
            f"tokenizer {spec!r} is a tiktoken encoding's name, not a tokenizer.json or hub repo; {instead} "
            "a tokenizer.json converted from its ranks (transformers' TikTokenConverter)"
        )
    return _from_hub(spec.removeprefix(HUB_PREFIX), revision)


#: how `tokshard train --model` names a hub model; a tokenizer's hub name may carry it too
HUB_PREFIX = "hf:"


def _from_hub(repo: str, revision: str | None) -> Path:
    """Download tokenizer.json from the hub, failing fast and clearly when it is unreachable."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from pipeline.storage.hub_client import RETRIES, quiet

    try:
        with quiet(RETRIES):
            path = Path(hf_hub_download(repo, TOKENIZER_FILE, revision=revision, etag_timeout=5))
    except HFValidationError as exc:  # `my tok`, `gpt2@main`: no hub repo can have that name
        raise TokshardError(
            f"no tokenizer at {repo!r}, and it cannot be a hub repo's name (a name is OWNER/NAME of letters, "
            "digits, '-', '_' and '.'); pass a tokenizer.json, a folder holding one, or a hub name such as gpt2"
        ) from exc
    except LocalEntryNotFoundError as exc:  # offline, or the hub unreachable: nothing cached
        raise TokshardError(
            f"tokenizer {repo!r} is not in the local hub cache and the hub cannot be reached; "
            "pass a local tokenizer.json with --tokenizer (e.g. one made by `tokshard tokenizer train`)"
            + ("" if hub_offline() else "; on a machine without network, HF_HUB_OFFLINE=1 says so at once")
        ) from exc
    except GatedRepoError as exc:  # Llama's and Gemma's repos, before their terms are accepted
        raise TokshardError(
            f"tokenizer {repo!r} is in a gated hub repo: accept its terms on huggingface.co and set "
            "HF_TOKEN (or `hf auth login`), or pass a local tokenizer.json"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise TokshardError(
            f"tokenizer {repo!r} not found on the hub (nor as a local path); check the name"
        ) from exc
    except EntryNotFoundError as exc:
        raise TokshardError(f"hub repo {repo!r} has no {TOKENIZER_FILE}; pass a local file") from exc
    except OSError as exc:
        raise TokshardError(f"cannot fetch tokenizer {repo!r} from the hub: {exc}") from exc
    # beside it in the same snapshot, where the repo has one: it may name the EOS (`find_eos`)
    with (
        contextlib.suppress(OSError, EntryNotFoundError, HfHubHTTPError),
        quiet(RETRIES),
    ):  # none, or unreachable
        hf_hub_download(repo, CONFIG_FILE, revision=revision, etag_timeout=5)
    return path


def load(path: str | os.PathLike):
    """A `tokenizers.Tokenizer` for a tokenizer.json, a malformed file a clear error.

    Parsed once per process and content: a run's driver inspects the tokenizer, then checks
    the encoders on its installed copy (0.15 s a parse for GPT-2's). Shared, so set up once
    for every caller: special-token text in a document encodes as text, never as a special
    id (only the pipeline's own separators are EOS ids).
    """
    data = read_bytes(path)
    return _parsed(_Content(hashlib.sha256(data).hexdigest(), data, str(path)))


def unreadable(path: str | os.PathLike, exc: Exception) -> TokshardError:
    """The one error for a tokenizer.json that cannot be read or parsed, whichever encoder reads it."""
    head = _head(Path(path))
    if lfs_pointer.size_stood_for(head) is not None:
        return TokshardError(
            f"{path} is a Git LFS pointer, not the tokenizer.json it stands for; {lfs_pointer.FETCH}"
        )
    settings = settings_hint(Path(path))
    if settings and not foreign_hint(Path(path)):  # valid JSON: the parse error of a tokenizer.json misleads
        return TokshardError(f"{path} is not a tokenizer.json: {settings}")
    hint = foreign_hint(Path(path)) or newer_format_hint(exc)
    if head.startswith(codecs.BOM_UTF8):
        hint = "it starts with a UTF-8 byte-order mark, which `tokenizers` does not read: save it without one"
    packed = _packed_as(head)
    if packed:
        hint = f"it is {packed}: unpack it and pass the tokenizer.json it holds"
    weights = _weights_kind(head)
    if weights:
        hint = f"it is {weights}, not a tokenizer: pass the tokenizer.json beside it"
    return TokshardError(f"{path} is not a readable tokenizer.json: {exc}" + (f"; {hint}" if hint else ""))


def _packed_as(head: bytes) -> str | None:
    """What compressed or archived a file (a download saved as it came), by its first bytes."""
    from pipeline.sources.files.formats import COMPRESSION_MAGIC, ZIP_MAGIC

    if head.startswith(ZIP_MAGIC):
        return "a zip archive"
    return next(
        (f"{name}-compressed" for magic, _, name in COMPRESSION_MAGIC if head.startswith(magic)), None
    )


#: the JSON files beside a tokenizer.json in a model's folder, which hold settings, not a vocabulary
SETTINGS_FILES = (
    "tokenizer_config.json",
    "config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "added_tokens.json",
)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE is set on (as huggingface_hub reads it): advice to set it is noise."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def settings_hint(path: Path) -> str:
    """Where a model folder's settings file was given for its tokenizer (a JSON object without
    the ``model`` every tokenizer.json has): which file to pass instead ('' otherwise)."""
    if path.suffix != ".json" or path.name == TOKENIZER_FILE:
        return ""
    try:
        obj = orjson.loads(json_object_bytes(path))
    except (OSError, ValueError):  # orjson.JSONDecodeError is a ValueError
        return ""
    if not isinstance(obj, dict) or "model" in obj:
        return ""
    beside = path.with_name(TOKENIZER_FILE)
    instead = f"pass {beside}" if beside.is_file() else f"pass the model's {TOKENIZER_FILE}"
    known = " (a model's settings)" if path.name in SETTINGS_FILES else ""
    return f'it is JSON without the "model" section of a {TOKENIZER_FILE}{known}: {instead}'


def newer_format_hint(exc: Exception) -> str:
    """Where `tokenizers` met a part it has no variant for: perhaps a newer release wrote the file."""
    if "did not match any variant" not in str(exc):
        return ""
    try:
        installed = f"tokenizers {_version('tokenizers')}"
    except PackageNotFoundError:
        installed = "the installed tokenizers"
    return (
        f"it has a part {installed} does not know: if a newer tokenizers saved it, upgrade "
        "tokenizers (pip install -U tokenizers)"
    )


def _head(path: Path) -> bytes:
    """The file's first bytes, enough to tell a Git LFS pointer (b"" where it cannot be read)."""
    try:
        with path.open("rb") as f:
            return f.read(lfs_pointer.MAX_BYTES)
    except OSError:
        return b""


#: how the vocabularies users bring in other formats become a tokenizer.json
CONVERSIONS = {
    "gpt2": "GPT-2's original encoder.json + vocab.bpe: convert them with `tokenizers` "
    "(ByteLevelBPETokenizer('encoder.json', 'vocab.bpe').save('tokenizer.json'))",
    "bpe_files": "a BPE's vocab.json + merges.txt (what transformers' slow tokenizers read): convert them "
    "with `tokenizers` (ByteLevelBPETokenizer('vocab.json', 'merges.txt').save('tokenizer.json'), for a "
    "byte-level BPE as GPT-2's and RoBERTa's are)",
    "tiktoken": "a tiktoken rank file: convert it with transformers' TikTokenConverter "
    "(transformers.integrations.tiktoken.convert_tiktoken_to_fast) into tokenizer.json",
    "sentencepiece": "a SentencePiece model: convert it with transformers "
    "(AutoTokenizer.from_pretrained(FOLDER).save_pretrained(OUT) writes tokenizer.json)",
    "tekken": "Mistral's tekken.json: convert it with transformers and mistral-common "
    "(AutoTokenizer.from_pretrained(FOLDER).save_pretrained(OUT) writes tokenizer.json)",
}


def foreign_hint(path: Path) -> str:
    """What to do with a vocabulary in another format than tokenizer.json ('' for none known)."""
    try:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
    except OSError:  # a folder this user may not list: nothing to say of its format
        return ""
    names = {p.name for p in files}
    if names & {"encoder.json", "vocab.bpe"} or path.suffix == ".bpe":
        return CONVERSIONS["gpt2"]
    if names & {"vocab.json", "merges.txt"}:
        return CONVERSIONS["bpe_files"]
    if names & {"tekken.json"}:
        return CONVERSIONS["tekken"]
    if any(p.suffix == ".tiktoken" or (p.suffix == ".model" and _holds_tiktoken_ranks(p)) for p in files):
        return CONVERSIONS["tiktoken"]
    if any(p.suffix == ".model" for p in files):
        return CONVERSIONS["sentencepiece"]
    return "pass the tokenizer.json itself" if path.is_dir() else ""


#: a tiktoken rank file's line: a token's bytes in base64, a space, its rank
_RANK_LINE = re.compile(rb"[A-Za-z0-9+/]+=* [0-9]+\r?\n")


def _holds_tiktoken_ranks(path: Path) -> bool:
    """Is this ``.model`` file tiktoken's ranks (Meta's Llama 3 ``original/tokenizer.model``),
    not a SentencePiece protobuf?"""
    return _RANK_LINE.match(_head(path)) is not None


def read_bytes(path: str | os.PathLike) -> bytes:
    """A tokenizer file's bytes (`json_object_bytes`), or the one error for them."""
    try:
        return json_object_bytes(path)
    except (OSError, ValueError) as exc:
        raise unreadable(path, exc) from exc


def json_object_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, once its first ones show a JSON object (ValueError if not): a model's
    weights named by mistake (gigabytes of safetensors) are refused before they are read into
    memory."""
    with open(path, "rb") as f:
        _check_json_start(f)
        f.seek(0)
        return f.read()


def _check_json_start(f: BinaryIO) -> None:
    """ValueError unless the first byte past a byte-order mark and whitespace is ``{``."""
    data = f.read(HEAD_BYTES).removeprefix(codecs.BOM_UTF8)
    while data and not data.lstrip():  # whitespace alone so far: read on, a chunk at a time
        data = f.read(1 << 16)
    if not data.lstrip().startswith(b"{"):
        raise ValueError("it does not start with '{' (a JSON object)")


def _starts_as_json(path: Path) -> Path:
    """``path``, once its first bytes show a JSON object: it is hashed before it is read, and a
    model's weights named by mistake would be hashed whole before the line that refuses them."""
    try:
        with path.open("rb") as f:
            _check_json_start(f)
    except (OSError, ValueError) as exc:
        raise unreadable(path, exc) from exc
    return path


#: how much of a tokenizer file is read to tell what it is before the rest is
HEAD_BYTES = 4096

#: the first bytes of model weights' files, and what they are
WEIGHTS_MAGIC = {b"GGUF": "a GGUF model file"}


def _weights_kind(head: bytes) -> str | None:
    """What model weights a file holds, by its first bytes (safetensors: an 8-byte header
    length, then the header's JSON)."""
    if len(head) >= 10 and head[8:10] == b'{"':
        return "a safetensors file of model weights"
    return next((kind for magic, kind in WEIGHTS_MAGIC.items() if head.startswith(magic)), None)


@dataclass(frozen=True)
class _Content:
    """A tokenizer.json's bytes, equal to another by content hash alone (the cache key)."""

    sha256: str
    data: bytes = field(compare=False, repr=False)
    path: str = field(compare=False)


@functools.lru_cache(maxsize=2)
def _parsed(content: _Content):
    from tokenizers import Tokenizer

    try:
        text = content.data.decode("utf-8")
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception for parse errors
        raise unreadable(content.path, exc) from exc
    unreachable = special_pieces_out_of_reach(text)
    if unreachable is not None:
        tok = Tokenizer.from_str(unreachable)
    tok.encode_special_tokens = True
    return encoding_whole_documents(tok)


def encoding_whole_documents(tok: Any) -> Any:
    """``tok`` (a `tokenizers` or fastokens Tokenizer) with the file's truncation and padding
    turned off: they shape a model's input batches, and a tokenizer.json saved with them (a
    ``max_length`` of 512, padding to 64) would otherwise cut every document, or pad it."""
    tok.no_truncation()
    tok.no_padding()
    return tok


#: how far below every other piece a special token's Unigram piece is put (see below)
OUT_OF_REACH = 1e4


def special_pieces_out_of_reach(text: str) -> str | None:
    """A Unigram tokenizer.json in which no special token's piece is ever chosen for text (None
    where nothing changes: any other model, or no special token among its pieces).

    With ``encode_special_tokens`` `tokenizers` hands special-token text to the model like any
    other text, and a Unigram model then picks the special token's own piece (T5's ``</s>``,
    score 0, the best there is): a literal ``</s>`` in a document would become the EOS id.
    Each such piece gets a score far below every other one, which only a span of characters
    with no other piece can still reach; ids, and every other piece's score, stay as they were
    (the unknown-character penalty moves by a constant for every segmentation, so no other
    choice changes). `DocumentEncoder` still checks every batch, so a span that reaches one
    anyway stops the run instead of writing the EOS id from text."""
    if '"Unigram"' not in text:
        return None
    spec = orjson.loads(text)
    model = spec.get("model") or {}
    if model.get("type") != "Unigram":
        return None
    specials = {t.get("content") for t in spec.get("added_tokens") or [] if t.get("special")}
    pieces = model.get("vocab") or []
    hits = [i for i, (piece, _) in enumerate(pieces) if piece in specials and i != model.get("unk_id")]
    if not hits:
        return None
    floor = min(score for _, score in pieces) - OUT_OF_REACH
    for i in hits:
        pieces[i] = [pieces[i][0], floor]
    return orjson.dumps(spec).decode("utf-8")


def max_id(tok) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(vocab.values()) if vocab else -1


def find_eos(tok, eos_token: str | None, path: str | os.PathLike) -> tuple[int, str, str]:
    """The EOS id and spelling, and how it was found: the one named, else the first of
    `EOS_CANDIDATES` the tokenizer has that document text cannot reach, else the one the
    tokenizer_config.json beside it names. A one-line refusal where document text could
    encode to it (the EOS id must come only from the pipeline's own separators)."""
    if eos_token:
        tid = tok.token_to_id(eos_token)
        if tid is None:
            raise TokshardError(f"{path} has no token {eos_token!r} (named by eos_token); {_eos_advice()}")
        return tid, eos_token, f"named by eos_token; {framing_kind(tok, tid, path)}"
    unsafe: list[tuple[str, TokshardError]] = []
    for name in EOS_CANDIDATES:
        tid = tok.token_to_id(name)
        if tid is None:
            continue
        try:
            kind = framing_kind(tok, tid, path)
        except TokshardError as exc:  # text reaches it: another spelling may be safe
            unsafe.append((name, exc))
            continue
        skipped = f" (not {', '.join(repr(n) for n, _ in unsafe)}, which text reaches)" if unsafe else ""
        return tid, name, f"the first of the usual EOS spellings it has{skipped}; {kind}"
    named = configured_eos(path)
    tid = tok.token_to_id(named) if named is not None else None
    if tid is not None:
        return tid, named, f"named by the {CONFIG_FILE} beside it; {framing_kind(tok, tid, path)}"
    if unsafe:
        raise unsafe[0][1]
    if named is None:
        beside = f", and no {CONFIG_FILE} beside it names one"
    else:
        beside = f"; the {CONFIG_FILE} beside it names {named!r}, which it lacks"
    raise TokshardError(
        f"{path} has no EOS token (none of {', '.join(EOS_CANDIDATES)}{beside}); {_eos_advice()}"
    )


def _eos_advice() -> str:
    return "name the token that ends a document with --eos-token TEXT (or eos_token in the recipe)"


def config_beside(path: str | os.PathLike, instead: str) -> dict[str, Any] | None:
    """The tokenizer_config.json beside a tokenizer.json (None: no such file). One that is there
    but does not read is refused, naming ``instead`` (the option that does without it): taken
    for none, it left out the EOS or BOS it names, and the run was framed otherwise."""
    config_path = Path(path).with_name(CONFIG_FILE)
    try:
        data = config_path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokshardError(f"cannot read {config_path} ({exc.strerror or exc}); {instead}") from exc
    try:
        config = orjson.loads(data.removeprefix(codecs.BOM_UTF8))
    except ValueError as exc:
        if lfs_pointer.size_stood_for(data) is not None:
            raise TokshardError(
                f"{config_path} is a Git LFS pointer, not its file; {lfs_pointer.FETCH}"
            ) from exc
        raise TokshardError(f"{config_path} is not JSON ({exc}); fix or remove it, or {instead}") from exc
    if not isinstance(config, dict):
        raise TokshardError(f"{config_path} is not a JSON object of settings; fix or remove it, or {instead}")
    return config


def configured_eos(path: str | os.PathLike) -> str | None:
    """The EOS the tokenizer_config.json beside a tokenizer.json names (None: no such file, or
    it names none)."""
    named = (config_beside(path, "name the EOS with --eos-token TEXT") or {}).get("eos_token")
    if isinstance(named, dict):  # written as an AddedToken
        named = named.get("content")
    return named if isinstance(named, str) and named else None


def framing_kind(tok, tid: int, path: str | os.PathLike, role: str = "EOS", by: str | None = None) -> str:
    """Why document text never encodes to a framing token's id ``tid`` (the EOS, or the BOS),
    as the manifest says it, or a one-line refusal: every framing token goes through here. An
    id that is no token of the vocabulary (a post-processor's template writes ids of its own)
    would not fit the dtype chosen for it, nor pass `verify`; an added token not marked special,
    or an entry of the model's vocabulary that text reaches, would start or end documents with
    an ordinary token, and turn its text into a boundary. ``by``: how the tokenizer itself puts
    it (a BOS that ``--bos-token auto`` found), None for one named or one of the usual EOS."""
    flag = f"--{role.lower()}-token"
    whence = f" ({by})" if by else ""
    instead = f"name another with {flag} TEXT, or {flag} none" if by else f"name a special token with {flag}"
    name = tok.id_to_token(tid)
    if name is None:
        raise TokshardError(
            f"{path}: its {role} id {tid}{whence} is not an id of its vocabulary (ids 0 to {max_id(tok)}); "
            f"{instead}"
        )
    token = tok.get_added_tokens_decoder().get(tid)
    if token is not None and not token.special:
        raise TokshardError(
            f"{path}: its {role} {name!r}{whence} is an added token not marked special, so tokenizers "
            f"cuts it out of document text and a literal {name!r} would become the {role} id; mark it "
            f'"special": true in the tokenizer.json, or {instead}'
        )
    model = type(tok.model).__name__
    reached = whole_word_reaches(tok, name, tid, path)
    if reached:
        if not by:  # named: another name, or another tokenizer
            instead = (
                f"name another with {flag}, or use a tokenizer whose {role} is a special token "
                "outside its vocabulary"
            )
        raise TokshardError(
            f"{path}: its {role} {name!r}{whence} is an entry of the {model} vocabulary that document text "
            f"reaches ({reached}), so a literal {name!r} would become the {role} id; {instead}"
        )
    if token is None:
        return f"an entry of the {model} vocabulary no text reaches (no merge makes it, nor a word)"
    if model == "Unigram" and tok.model.token_to_id(name) == tid:
        return (
            "a special token; its Unigram piece, as every special token's, is scored below all others "
            f"for this run, so document text takes another segmentation (tokenizers on the file as it "
            f"is gives a literal {name!r} the {role} id)"
        )
    return "a special token; its text inside a document is encoded as ordinary text"


def whole_word_reaches(tok, name: str, tid: int, path: str | os.PathLike) -> str | None:
    """How text could reach the EOS as a vocabulary entry of the model (None: it cannot): a
    Unigram piece that is no special token (those are put out of reach by their scores), a
    single character BPE starts from, a whole word equal to it where the model maps whole
    words (WordLevel, WordPiece, BPE with ``ignore_merges``) and the pre-tokenizer keeps it
    one word, or a merge that makes it."""
    from tokenizers import models

    model = tok.model
    if model.token_to_id(name) != tid:
        return None
    if isinstance(model, models.Unigram):
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        return None if name in specials else "a Unigram model may choose any of its pieces for text"
    if isinstance(model, models.BPE) and len(name) == 1:
        return "a single character, which BPE starts every word from"
    spec = read_spec(path) if isinstance(model, models.BPE) else {}
    bpe = spec.get("model") or {}
    if bpe and any(a + b == name for a, b in byte_level.merge_pairs(bpe.get("merges") or [])):
        return "a merge makes it"
    whole = isinstance(model, models.WordLevel | models.WordPiece) or bool(bpe.get("ignore_merges"))
    pre = tok.pre_tokenizer
    words = [w for w, _ in pre.pre_tokenize_str(name)] if pre is not None else [name]
    if whole and len(words) == 1:
        return "the pre-tokenizer keeps it one word, which the model maps whole"
    return None


#: the dtype setting that lets the tokenizer decide
AUTO_DTYPE = "auto"


def choose_dtype(vocab_size: int, requested: str, where: str) -> tuple[str, str]:
    """The token dtype for a tokenizer whose ids are below ``vocab_size`` (added tokens
    counted), and why: for ``auto`` uint16 where every id fits, else uint32. A dtype asked for
    that cannot hold every id is refused before any work: never truncate silently."""
    largest = vocab_size - 1
    if requested == AUTO_DTYPE:
        if vocab_size <= UINT16_LIMIT:
            return "uint16", f"auto: every id fits uint16 (the largest is {largest})"
        return "uint32", f"auto: ids go up to {largest}, which does not fit uint16"
    if requested not in TOKEN_DTYPES:
        choices = " or ".join((AUTO_DTYPE, *TOKEN_DTYPES))
        raise TokshardError(f"dtype {requested!r} is not supported; use {choices}")
    if requested == "uint16" and vocab_size > UINT16_LIMIT:
        raise TokshardError(
            f"{where}: ids go up to {largest}, which does not fit uint16; "
            'pass --dtype auto or uint32 (or dtype = "auto" in the recipe)'
        )
    return requested, f"requested with --dtype {requested}"


def bos_config(path: Path, bos_token: str | None) -> dict[str, Any] | None:
    """The config that decides `--bos-token auto`; for any other choice it only adds a note,
    so one that does not read is passed over."""
    try:
        return config_beside(path, f"name the BOS with --bos-token TEXT (or --bos-token {NO_BOS})")
    except TokshardError:
        if bos_token == AUTO_BOS:
            raise
        return None


def inspect_file(
    path: Path, origin: str, eos_token: str | None, dtype: str, bos_token: str | None = None
) -> TokenizerInfo:
    tok = load(path)  # first: a file that is no tokenizer.json is named as such
    refuse_random_splits(path, origin)
    vocab_size = max_id(tok) + 1
    chosen, why = choose_dtype(vocab_size, dtype, f"tokenizer {origin}")
    eos_id, eos_name, eos_found = find_eos(tok, eos_token, path)
    bos = find_bos(tok, read_spec(path), bos_config(path, bos_token), bos_token, eos_id, path)
    if bos.id is not None:  # named, or the tokenizer's own (auto): checked as the EOS is, before any work
        framing_kind(tok, bos.id, path, "BOS", bos.found if bos_token == AUTO_BOS else None)
    return TokenizerInfo(
        path=TOKENIZER_FILE,
        sha256=sha256_file(path),
        vocab_size=vocab_size,
        eos_id=eos_id,
        eos_token=eos_name,
        origin=origin,
        dtype=chosen,
        dtype_reason=why,
        eos_found=eos_found,
        bos_id=bos.id,
        bos_token=bos.token,
        bos_found=bos.found,
        bos_unused=bos.unused,
    )


def refuse_random_splits(path: Path, origin: str) -> None:
    """A BPE model with ``dropout`` (BPE-dropout) splits words at random on each call: shards
    written once would hold one draw for every epoch (not the regularization it is meant to
    be), and no run could be reproduced, checked against another encoder, or resumed."""
    dropout = (read_spec(path).get("model") or {}).get("dropout")
    if dropout:
        raise TokshardError(
            f"tokenizer {origin}: its BPE model sets dropout {dropout}, which splits words at random "
            'on every call, so shards could not be reproduced or resumed; set "dropout" to null in '
            "its model and pass that file"
        )


def resolve(
    spec: str, eos_token: str | None, dtype: str, bos_token: str | None = None
) -> tuple[Path, TokenizerInfo]:
    """Find TOK and check it fits the run (EOS present, ids fit the dtype)."""
    src = locate(spec)
    return src, inspect_file(src, spec, eos_token, dtype, bos_token)


def install(src: Path, info: TokenizerInfo, out_dir: Path) -> Path:
    """Copy the tokenizer beside the manifest as ``tokenizer.json`` (once)."""
    from pipeline.format.atomic import copy_file

    dest = out_dir / TOKENIZER_FILE
    if not (dest.exists() and sha256_file(dest) == info.sha256):
        copy_file(src, dest)  # durable and whole (a full disk gives a clear error)
    return dest


def is_byte_level_bpe(tok) -> bool:
    """True for GPT-2 style tokenizers (`pipeline.encoding.byte_level` defines the shape)."""
    return byte_level.is_byte_level_bpe(json.loads(tok.to_str()))


@dataclass(frozen=True)
class Trained:
    """What `train` wrote, and from how much: the documents read and the bad records skipped."""

    path: Path
    documents: int
    skipped: dict[str, int]
    #: the ids it holds: the --vocab-size asked for, or fewer where the text ran out of pairs to merge
    ids: int
    #: the documents that hold the EOS's (delimited) spelling as text, and where the first is
    eos_in_text: int = 0
    eos_first_place: str | None = None


@dataclass(frozen=True)
class TrainProgress:
    """How training shows its progress: `tokenizers`' own bars (on a terminal), and lines given
    to ``log`` (elsewhere: logs, CI), each optional. A library caller gets neither."""

    bar: bool = False
    log: Callable[[str], None] | None = None


def train(
    inputs: list[str],
    vocab_size: int,
    out_dir: Path,
    eos_token: str = DEFAULT_EOS,
    text_field: str = "text",
    skip_bad: bool = False,
    max_token_length: int = DEFAULT_MAX_TOKEN_LENGTH,
    progress: TrainProgress = TrainProgress(),
) -> Trained:
    """Train a byte-level BPE (GPT-2 style) with EOS as its only special token. A bad record
    stops it as it stops `prepare` (``skip_bad``: counted instead); inputs with no document
    to learn from are refused, never a tokenizer of bytes alone. No token is longer than
    ``max_token_length`` (`training_pre_tokenizer` says why)."""
    from pipeline.sources.files import list_files

    files = list_files(inputs, ".")  # the same globs, and each file once, as `prepare --input`
    for flag, value, (low, high) in (
        ("--vocab-size", vocab_size, VOCAB_SIZES),
        ("--max-token-length", max_token_length, TOKEN_LENGTHS),
    ):
        if not low <= value <= high:
            raise TokshardError(f"{flag} {value} is {out_of_range(low, high)}")
    utf8_path(out_dir / TOKENIZER_FILE, "--out")  # before the training's minutes, not after
    made = missing_folders(out_dir)
    check_writable_dir(out_dir, "--out")
    try:
        with one_trainer(out_dir):
            settings = _Settings(vocab_size, eos_token, text_field, skip_bad, max_token_length)
            return _train(files, settings, out_dir, progress)
    except DiskFullError as exc:  # its line must not promise kept work: training commits none
        take_back_folders(made)
        raise exc.ending("then rerun the same command: no tokenizer was written") from exc
    except BaseException:
        take_back_folders(made)  # a failed run leaves none of the folders it made behind
        raise


@contextlib.contextmanager
def one_trainer(out_dir: Path) -> Iterator[None]:
    """``out_dir`` locked for this training to its end, and judged under the lock to be new or
    empty: of two trainings started into one folder at once, both found it empty, and the
    second's tokenizer.json silently replaced the first's. The second is refused in one line
    naming the first; a holder that dies lets go at once, and one that ends removes the lock."""
    from pipeline.storage.ownership import claim_folder

    lock = out_dir / TRAIN_LOCK
    fd = take_lock(
        lock,
        lambda: TokshardError(
            f"another `tokshard tokenizer train` ({holder_text(lock)}) is writing into --out {out_dir}; "
            "wait for it to end or stop it, then rerun"
        ),
    )
    try:
        claim_folder(out_dir, "--out", "tokenizer train", ignore=(TRAIN_LOCK,))
        yield
    finally:
        release_lock(fd, lock)


@dataclass(frozen=True)
class _Settings:
    """What `train` was asked for, as `_train` uses it."""

    vocab_size: int
    eos_token: str
    text_field: str
    skip_bad: bool
    max_token_length: int


def training_pre_tokenizer(max_token_length: int):
    """The pre-tokenizer training reads words with: GPT-2's byte-level split, each word longer
    than ``max_token_length`` characters cut into pieces that long. `tokenizers`' BPE trainer
    takes time in the square of a word's length (each merge inside a word moves the rest of
    it), so one 400,000-character word with no space (DNA, base64, minified data) took minutes
    in silence; cut into pieces it takes seconds. A word no longer is split exactly as the saved
    tokenizer's own ByteLevel splits it, so ordinary text learns the same vocabulary."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(byte_level.gpt2_pattern_within(max_token_length)), behavior="isolated"
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


class _Reading:
    """What training has read, said in lines (`TrainProgress.log`): `tokenizers` reads all the
    input before it learns a merge, and says nothing of either unless it draws its bars."""

    def __init__(self, log: Callable[[str], None] | None) -> None:
        self.log = log
        self.documents = 0
        self.characters = 0
        self.start = self.last = time.monotonic()

    def __str__(self) -> str:
        return (
            f"{self.documents:,} document{'' if self.documents == 1 else 's'} "
            f"({self.characters:,} characters) in {time.monotonic() - self.start:.0f} s"
        )

    def add(self, text: str) -> None:
        self.documents += bool(text) and not text.isspace()  # as `prepare` drops it: no document
        self.characters += len(text)
        if self.log is not None and time.monotonic() - self.last >= READING_INTERVAL:
            self.last = time.monotonic()
            self.log(f"read {self}")

    def finished(self, vocab_size: int) -> None:
        if self.log is not None and self.documents:
            self.log(
                f"read {self}; learning merges up to {vocab_size:,} ids (no more lines until it is done)"
            )


def _train(files: list[Any], settings: _Settings, out_dir: Path, progress: TrainProgress) -> Trained:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipeline.sources.files import iter_documents, place_text

    eos_token = settings.eos_token
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = training_pre_tokenizer(settings.max_token_length)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress.bar,
    )
    skipped: dict[str, int] = {}
    reading = _Reading(None if progress.bar else progress.log)

    quoted, first_quote = 0, None  # the documents that hold the EOS's delimited spelling as text

    def texts() -> Iterator[str]:
        nonlocal quoted, first_quote
        for text, rec in iter_documents(files, settings.text_field, skipped if settings.skip_bad else None):
            if eos_token in text:
                if not looks_special(eos_token):
                    raise _eos_in_text(eos_token, place_text(rec))
                quoted += 1
                first_quote = first_quote or place_text(rec)
            reading.add(text)
            yield text
        reading.finished(settings.vocab_size)

    interruptible(lambda: tok.train_from_iterator(texts(), trainer), "tokshard-tokenizer-train")
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's, as saved before
    documents = reading.documents
    if not documents:
        raise DataError(
            f"the inputs hold no text to train on{_skipped_note(skipped, settings.skip_bad)}; check the "
            "input files and --text-field (no tokenizer was written)"
        )
    dest = out_dir / TOKENIZER_FILE
    tmp = out_dir / (TOKENIZER_FILE + ".tmp")
    # written by us, not `tok.save` (the same bytes), whose bare Exception could not tell a full
    # disk from an unwritable folder: `write_durable` says which, and how much is needed
    write_durable(tmp, tok.to_str(pretty=True).encode())
    try:
        _refuse_eos_text_reaches(tok, eos_token, tmp)
        # what names the EOS to `prepare --tokenizer OUT/` (and to transformers), whatever its spelling
        write_json(out_dir / CONFIG_FILE, trained_config(eos_token, settings.max_token_length))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return Trained(dest, documents, skipped, tok.get_vocab_size(), quoted, first_quote)


#: the key of tokenizer_config.json under which `tokshard tokenizer train` records how it trained
#: (transformers keeps a key it does not know, and reads the file as before)
TRAINING_KEY = "tokshard_training"


def trained_config(eos_token: str, max_token_length: int) -> dict[str, Any]:
    """The tokenizer_config.json beside a trained tokenizer.json: what names its EOS to
    `prepare --tokenizer OUT/` and to transformers, and the setting that shaped its vocabulary
    beyond the command's own numbers (``--max-token-length``)."""
    return {
        "eos_token": eos_token,
        "tokenizer_class": "PreTrainedTokenizerFast",
        TRAINING_KEY: {"max_token_length": max_token_length},
    }


def _skipped_note(skipped: dict[str, int], skip_bad: bool) -> str:
    """How many bad records were skipped, where --on-bad-record skip could skip any."""
    if not skip_bad:
        return ""
    total = sum(skipped.values())
    return f" ({counted(total, 'bad record')} skipped)"


def looks_special(spelling: str) -> bool:
    """Is it spelled as special tokens are (``<|endoftext|>``, ``</s>``, ``[SEP]``): delimited so
    that text holds it only where it quotes one (web pages and code about language models). Such
    text is a known cost of every published tokenizer, said in a note; a spelling text holds
    as words (``--eos the``) is refused."""
    return len(spelling) >= 3 and (spelling[0], spelling[-1]) in (("<", ">"), ("[", "]"))


def _eos_in_text(eos_token: str, where: str) -> TokshardError:
    """A training document holds the EOS's spelling as words (`looks_special`: not delimited).
    `prepare` encodes it as text, but every library that loads the tokenizer.json (tokenizers,
    transformers) matches special tokens in text first: there ``--eos the`` would turn each
    "the" into the EOS id."""
    instead = "<|doc_end|>" if eos_token == DEFAULT_EOS else DEFAULT_EOS
    return TokshardError(
        f"--eos {eos_token!r}: {where} holds it as text, and libraries that load a tokenizer "
        "(tokenizers, transformers) match its special tokens in text first, so there that text would "
        f"become the EOS id; choose a spelling no document holds with --eos (such as {instead}); "
        "no tokenizer was written"
    )


def _refuse_eos_text_reaches(tok, eos_token: str, path: Path) -> None:
    """A trained vocabulary may hold the EOS's spelling as text (``--eos the``: a merge makes
    it, and BPE starts from single characters): a document holding it would encode to the EOS
    id, which `prepare` refuses, so no such tokenizer is written."""
    reached = whole_word_reaches(tok, eos_token, tok.token_to_id(eos_token), path)
    if reached:
        raise TokshardError(
            f"--eos {eos_token!r}: the trained vocabulary reaches it from text ({reached}), so "
            f"{_text_reaching(eos_token)} would encode to the EOS id; choose a spelling no document holds (the "
            f"default is {DEFAULT_EOS}); no tokenizer was written"
        )


def _text_reaching(eos_token: str) -> str:
    """Which text of a document would become the EOS: its spelling, or where that spelling is
    a byte-level symbol (``Ġ``), the byte it stands for (every space no merge joins to a word)."""
    raw = byte_level.stood_for(eos_token)
    if raw is None:
        return f"a document holding {eos_token!r}"
    if len(raw) == 1:
        name = byte_level.byte_name(raw[0])
        return f"every {name} in a document that no merge joins to its neighbours ({eos_token!r} stands for the {name})"
    spelled = " ".join(f"0x{b:02X}" for b in raw)
    return (
        f"a document holding the bytes {spelled} ({eos_token!r} stands for them in a byte-level vocabulary)"
    )


def from_gpt2_files(encoder_json: Path, vocab_bpe: Path, out: Path, eos_token: str = DEFAULT_EOS) -> Path:
    """A tokenizer.json from OpenAI's original GPT-2 files (encoder.json, vocab.bpe).

    For sites that have those two files but no hub access; ids equal GPT-2's exactly.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads(Path(encoder_json).read_text(encoding="utf-8"))
    lines = Path(vocab_bpe).read_text(encoding="utf-8").splitlines()[1:]  # first line: version
    merges = [tuple(line.split(" ")) for line in lines if line]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(eos_token, special=True)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(utf8_path(out, "--out"))
    return out


def read_spec(path: str | Path) -> dict[str, Any]:
    """The parsed tokenizer.json, parsed once per process and content (a 200k vocabulary's
    file takes half a second to parse, and a worker's start asks for it several times):
    shared, so never changed by a caller."""
    data = read_bytes(path)
    return _spec(_Content(hashlib.sha256(data).hexdigest(), data, str(path)))


@functools.lru_cache(maxsize=2)
def _spec(content: _Content) -> dict[str, Any]:
    """By orjson (a quarter of `json`'s time), by `json` where orjson refuses a file `json`
    may still read."""
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(content.data)
    try:
        return json.loads(content.data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise unreadable(content.path, exc) from exc
