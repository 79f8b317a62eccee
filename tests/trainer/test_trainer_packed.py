"""Packed windows on real shards (`--packing best-fit`): what a row holds, its targets, one epoch
holding every token once, determinism in (seed, position), and padding that neither the loss nor
a document's attention ever sees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support import cached_manifest

from pipeline.format import manifest as manifest_mod
from pipeline.format.errors import DataError
from trainer import docmask
from trainer.data import WindowDataset
from trainer.model import GPT, GPTConfig
from trainer.packed import PackedDataset
from trainer.prefetch import Prefetcher
from trainer.sampler import rank_positions
from trainer.schedule import Schedule, window_sources

SEQ = 64


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return cached_manifest(tmp_path_factory)


@pytest.fixture(scope="module")
def packed(manifest) -> PackedDataset:
    return PackedDataset(manifest_mod.load(manifest), "train", SEQ, buffer=16)


def document_spans(data: PackedDataset, source: int) -> np.ndarray:
    """Each document's [start, end) in its source's stream."""
    ends = data.streams[source].document_ends()
    return np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)


def test_a_row_is_its_pieces_then_eos_padding_and_its_targets_skip_padding_and_cuts(packed):
    eos, window = packed.eos_id, SEQ + 1
    for source in range(len(packed.sources)):
        bins = np.arange(packed.windows[source], dtype=np.int64)
        rows = packed.batch(np.full(len(bins), source), bins)
        inputs, targets = packed.inputs_targets(rows)
        assert inputs.shape == targets.shape == (len(bins), SEQ)
        spans = document_spans(packed, source)
        for b in bins.tolist():
            row, want, ignored = rows[b], [], []
            for piece in packed.pieces(source, b):
                lo = int(spans[piece.document, 0])
                if piece.start > 0 and want:  # a later piece of a cut document after another one
                    ignored.append(len(want) - 1)
                want += packed.streams[source].read(lo + piece.start, piece.end - piece.start).tolist()
            used = len(want)
            assert used + packed.describe(source, b)["padding"] == window
            assert row[:used].tolist() == want and (row[used:window] == eos).all()
            expected = row[1:window].copy()
            expected[used - 1 :] = docmask.IGNORE
            expected[ignored] = docmask.IGNORE
            assert targets[b].tolist() == expected.tolist()
            assert packed.tokens_of(source, b).tolist() == want


def test_one_epoch_of_bins_holds_every_token_once_and_cuts_no_document_that_fits(packed):
    for source in range(len(packed.sources)):
        spans = document_spans(packed, source)
        seen = np.zeros(len(spans), dtype=np.int64)  # tokens of each document met in the epoch
        pieces_of: dict[int, int] = {}
        for b in range(packed.windows[source]):
            for piece in packed.pieces(source, b):
                seen[piece.document] += piece.end - piece.start
                pieces_of[piece.document] = pieces_of.get(piece.document, 0) + 1
        lengths = spans[:, 1] - spans[:, 0]
        assert (seen == lengths).all()
        fits = lengths <= SEQ + 1
        assert fits.any() and all(pieces_of[d] == 1 for d in np.flatnonzero(fits).tolist())
        assert all(pieces_of[d] == -(-lengths[d] // (SEQ + 1)) for d in range(len(lengths)))


def test_plain_windows_cut_documents_that_fit_and_packed_ones_do_not(manifest, packed):
    """The reason for packing, on this corpus: windows cut some documents that would fit one."""
    plain = WindowDataset(manifest_mod.load(manifest), "train", SEQ)
    for source in range(len(packed.sources)):
        spans = document_spans(packed, source)
        fits = spans[(spans[:, 1] - spans[:, 0]) <= SEQ + 1]
        window_of_start = fits[:, 0] // SEQ
        cut = (fits[:, 1] > window_of_start * SEQ + SEQ + 1).sum()
        assert cut > 0  # plain windows split these documents in two
        whole = {p.document for b in range(packed.windows[source]) for p in packed.pieces(source, b)}
        assert whole == set(range(len(spans)))
        assert plain.windows[source] >= 1


def test_packed_samples_are_a_pure_function_of_seed_and_position(manifest):
    m = manifest_mod.load(manifest)
    positions = np.arange(1000, 1064, dtype=np.int64)

    def rows(order: np.ndarray) -> np.ndarray:
        data = PackedDataset(m, "train", SEQ, buffer=16)
        draws = Schedule.fresh(window_sources(data), {"stdlib": 1.0, "asyncio": 2.0}, 7).draw(order)
        return data.batch(draws.sources, draws.windows)

    forward, backward = rows(positions), rows(positions[::-1])
    assert np.array_equal(forward, backward[::-1])
    other_seed = PackedDataset(m, "train", SEQ, buffer=16)
    draws = Schedule.fresh(window_sources(other_seed), {"stdlib": 1.0, "asyncio": 2.0}, 8).draw(positions)
    assert not np.array_equal(forward, other_seed.batch(draws.sources, draws.windows))


def padded_rows(packed: PackedDataset) -> tuple[np.ndarray, torch.Tensor]:
    """Real packed rows with two documents or more and some padding, and where the padding is."""
    chosen = []
    for b in range(packed.windows[0]):
        if len(packed.pieces(0, b)) >= 2 and packed.describe(0, b)["padding"] >= 4:
            chosen.append(b)
        if len(chosen) == 4:
            break
    assert len(chosen) == 4
    used = torch.tensor([SEQ + 1 - packed.describe(0, b)["padding"] for b in chosen])
    return packed.batch(np.zeros(4, dtype=np.int64), np.array(chosen)), torch.arange(SEQ) >= used[:, None]


def test_padding_changes_no_loss_and_doc_mask_loss_equals_each_document_alone(packed):
    rows, padding = padded_rows(packed)
    inputs, targets = packed.inputs_targets(torch.from_numpy(rows))
    eos = packed.eos_id
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=1024, block_size=SEQ)).eval()
    doc = docmask.document_ids(inputs, eos)
    masked = docmask.loss_targets(inputs, targets, eos, eod_mask_loss=True)
    assert (targets[padding] == docmask.IGNORE).all()
    scrambled = inputs.clone()
    scrambled[padding] = 7  # other ids where only padding was
    with torch.no_grad():
        plain, together = model(inputs, targets).item(), model(inputs, masked, doc).item()
        assert model(scrambled, targets).item() == pytest.approx(plain, rel=1e-6)
        scrambled_doc = docmask.document_ids(scrambled, eos)
        assert model(scrambled, masked, scrambled_doc).item() == pytest.approx(together, rel=1e-6)
        total, count = 0.0, 0
        for r in range(len(inputs)):
            for d in doc[r].unique().tolist():
                span = (doc[r] == d).nonzero().flatten()  # one document (or one padding token) alone
                keep = masked[r, span] != docmask.IGNORE
                if keep.any():
                    logits = model(inputs[r, span][None])
                    ce = torch.nn.functional.cross_entropy(
                        logits[0][keep].float(), targets[r, span][keep], reduction="sum"
                    )
                    total, count = total + ce.item(), count + int(keep.sum())
    assert together == pytest.approx(total / count, rel=1e-5)
    mask = docmask.dense_mask(doc)[:, 0]
    for r in range(len(inputs)):
        real = ~padding[r]
        assert not mask[r][real][:, ~real].any() and not mask[r][~real][:, real].any()


def test_the_prefetcher_hands_packed_inputs_and_targets(packed):
    schedule = Schedule.fresh(window_sources(packed), {"stdlib": 1.0, "asyncio": 1.0}, 3)
    plan = [rank_positions(8 * i, 0, 0, 1, 4) for i in range(5)]
    got = list(Prefetcher(packed, schedule, iter(plan), torch.device("cpu"), depth=2))
    for positions, batch in zip(plan, got, strict=True):
        d = schedule.draw(positions)
        inputs, targets = packed.inputs_targets(torch.from_numpy(packed.batch(d.sources, d.windows)))
        assert torch.equal(batch.inputs, inputs) and torch.equal(batch.targets, targets)


def test_an_index_that_disagrees_with_the_manifest_is_one_line(manifest, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(manifest.parent, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    idx = copy / doc["shards"][0]["path"].replace(".bin", ".idx")
    raw = bytearray(idx.read_bytes())
    first = 9 + 8 + 1 + 8 + 8  # the header; then the first document's length (int32)
    raw[first : first + 4] = (int.from_bytes(raw[first : first + 4], "little") + 1).to_bytes(4, "little")
    idx.write_bytes(bytes(raw))
    with pytest.raises(
        DataError, match=r"document lengths do not add up to the \d+ documents and \d+ tokens the manifest"
    ):
        PackedDataset(manifest_mod.load(copy), "train", SEQ)
