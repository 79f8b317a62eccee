"""The token that starts each document, if any.

By default a document is ``encode(doc) + [EOS]`` (DESIGN.md: the plain tokenizer on the
document), so a run starts documents with no BOS. But Gemma's and Meta's Llama 3 files start
every text with their BOS when `tokenizers` or transformers encode it (a post-processor's
template, or ``add_bos_token`` in the tokenizer_config.json beside it), those models were
trained on documents framed so, and peers that encode with the tokenizer's defaults (Megatron's
``preprocess_data``) write it. So ``--bos-token auto`` writes the tokenizer's own BOS where it
puts one, ``--bos-token TEXT`` a token named, and a run left at the default says when the
tokenizer has one it does not write. The pipeline writes the id itself (the back ends encode
the text alone).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pipeline.format.errors import TokshardError

#: ``bos_token`` asking for the tokenizer's own BOS, where it puts one before a text
AUTO_BOS = "auto"
#: ``bos_token`` asking for no BOS, and no word about the tokenizer's
NO_BOS = "none"


@dataclass(frozen=True)
class Bos:
    """The BOS chosen for a run: its id and text (None: documents start with their text), and
    why; ``unused`` is the tokenizer's own BOS where the run leaves it out by default."""

    id: int | None
    token: str | None
    found: str
    unused: str | None = None


def find_bos(
    tok,
    spec: dict[str, Any],
    config: dict[str, Any] | None,
    named: str | None,
    eos_id: int,
    path: str | os.PathLike,
) -> Bos:
    """The BOS for ``named``: a token's text, `AUTO_BOS`, `NO_BOS`, or None (the default: none,
    noting the tokenizer's own)."""
    if named == NO_BOS:
        return Bos(None, None, "none: --bos-token none")
    if named is not None and named != AUTO_BOS:
        tid = tok.token_to_id(named)
        if tid is None:
            raise TokshardError(
                f"{path} has no token {named!r} (named by bos_token); name one it has with --bos-token "
                f"TEXT, --bos-token {AUTO_BOS} for the tokenizer's own, or --bos-token {NO_BOS}"
            )
        if tid == eos_id:  # as for the tokenizer's own (OPT's </s>): never two in a row
            return Bos(None, None, "none: bos_token names the EOS, which already ends the document before")
        return Bos(tid, named, "named by bos_token")
    try:
        own = own_bos(tok, spec, config, eos_id, path)
    except TokshardError:
        if named == AUTO_BOS:
            raise
        return Bos(None, None, "none (the default)")
    if named == AUTO_BOS or own.id is None:
        return own
    return Bos(None, None, f"none (the default; --bos-token {AUTO_BOS} writes it): {own.found}", own.token)


def own_bos(
    tok, spec: dict[str, Any], config: dict[str, Any] | None, eos_id: int, path: str | os.PathLike
) -> Bos:
    """The BOS the tokenizer itself puts before a text: the config's ``add_bos_token`` where it
    says (transformers' Llama and Gemma tokenizers follow it over the template), else the
    template of the post-processor in ``spec``. A BOS that is the EOS is not written: the
    document before already ends with it. Not checked here: `tokenizer.framing_kind` checks
    the id a run writes (in its vocabulary, out of reach of text) as it checks the EOS."""
    by_config = _by_config(config)
    name, why, tid = (*by_config, None) if by_config else _by_template(spec, path)
    if name is None:
        return Bos(None, None, f"none: {why}")
    tid = tok.token_to_id(name) if tid is None else tid
    if tid is None:
        raise TokshardError(
            f"{path}: {why}, which it lacks; name its BOS with --bos-token TEXT, or --bos-token {NO_BOS}"
        )
    if tid == eos_id:
        return Bos(None, None, f"none: {why}, its EOS, which already ends the document before")
    written = tok.id_to_token(tid)  # a template's own id may be another token's (checked by the caller)
    if written is not None and written != name:
        return Bos(tid, written, f"{why}, written as id {tid}, its vocabulary's {written!r}")
    return Bos(tid, name, why)


def _by_config(config: dict[str, Any] | None) -> tuple[str | None, str] | None:
    """What a tokenizer_config.json's ``add_bos_token`` decides (None: it says nothing)."""
    add = (config or {}).get("add_bos_token")
    if not isinstance(add, bool):
        return None
    if not add:
        return None, "the tokenizer_config.json beside it sets add_bos_token false"
    name = (config or {}).get("bos_token")
    if isinstance(name, dict):  # written as an AddedToken
        name = name.get("content")
    if not isinstance(name, str) or not name:  # the template names the token, as transformers finds it
        return None
    return name, f"the tokenizer_config.json beside it sets add_bos_token, with bos_token {name!r}"


#: post-processors that frame a single text as ``cls TEXT sep`` (BERT's and RoBERTa's files)
_CLS_SEP = ("BertProcessing", "RobertaProcessing")


def _by_template(spec: dict[str, Any], path: str | os.PathLike) -> tuple[str | None, str, int | None]:
    """The special token a tokenizer.json's post-processor puts before a single text, and the
    id its template gives it (None: the vocabulary's, as BERT's and RoBERTa's processors use).
    A template names each of its tokens by a key whose entry holds the ids it writes, as
    `tokenizers` does: the key need not be the token (``BOS`` for ``<s>``), nor its id the
    vocabulary's."""
    post = spec.get("post_processor") or {}
    steps = post.get("processors") or [] if post.get("type") == "Sequence" else [post]
    framing = [s for s in steps if isinstance(s, dict) and s.get("type") in ("TemplateProcessing", *_CLS_SEP)]
    if not framing:
        return None, "its post-processor puts no token before a text", None
    last = framing[-1]
    if last["type"] in _CLS_SEP:
        cls = last["cls"][0]
        return cls, f"its post-processor ({last['type']}) starts each text with {cls!r}", None
    lead = []
    for piece in last.get("single") or []:
        if "SpecialToken" not in piece:
            break
        lead.append(piece["SpecialToken"]["id"])
    if not lead:
        return None, "its post-processor's template starts with the text", None
    if len(lead) > 1:
        raise TokshardError(
            f"{path}: its post-processor's template puts {len(lead)} tokens before each text ({', '.join(lead)}); "
            f"tokshard starts a document with one at most: name it with --bos-token TEXT, or --bos-token {NO_BOS}"
        )
    entry = (last.get("special_tokens") or {}).get(lead[0]) or {}
    ids, tokens = entry.get("ids") or [], entry.get("tokens") or []
    if len(ids) != 1 or len(tokens) != 1:  # a key without its entry, or one of several ids
        return lead[0], f"its post-processor's template starts each text with {lead[0]!r}", None
    return (
        tokens[0],
        f"its post-processor's template starts each text with {tokens[0]!r}",
        ids[0],
    )
