"""`tokshard samples --origin` (issue 33, item 2): every document of every sample is traced to
its input and its line, row or byte offset, and reading that place back finds the text that
`--decode` shows, for each kind of input (plain, gzip and zstd JSON Lines, parquet, .txt, a hub
mirror, objects in a bucket), after a change of mixture and a resume on another number of
ranks. Real prepare, real DeepSpeed on CPU, a real S3 server; old data says it has no provenance."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import SMALL, cli, launch, one_error_line
from tokenizers import Tokenizer

from pipeline.format import manifest as manifest_mod
from pipeline.format import provenance
from pipeline.format.shard_reader import Shard

#: documents per input file; each is a short stretch of real text, so a window holds several
PER_FILE = 4
STEPS = 6
SHOWN = "1-40"  # the trained steps and the ones a resume would train next


def texts(docs: list[str], first: int) -> list[str]:
    return [" ".join(d.split())[:160] for d in docs[first : first + PER_FILE]]


def jsonl_bytes(rows: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in rows).encode()


@pytest.fixture(scope="module")
def traced(tmp_path_factory, docs, tokenizer_path, s3_server) -> dict:
    """Data of every input kind prepared into one folder; a run trained 3 steps with one mix on
    one rank, then resumed to 6 with another mix on two; `samples --origin --decode --json`."""
    root = tmp_path_factory.mktemp("origin")
    local = root / "in"
    local.mkdir()
    (local / "a.jsonl").write_bytes(jsonl_bytes(texts(docs, 0)))
    (local / "b.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(texts(docs, 4))))
    (local / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(texts(docs, 8))))
    pq.write_table(pa.table({"text": texts(docs, 12)}), local / "d.parquet", row_group_size=2)
    for i, t in enumerate(texts(docs, 16)):
        (local / f"e{i}.txt").write_text(t)
    repo = root / "mirror" / "acme" / "notes"
    (repo / "data").mkdir(parents=True)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n"
    )
    hub_rows = texts(docs, 20) + texts(docs, 24)
    pq.write_table(pa.table({"content": hub_rows}), repo / "data/train-00000-of-00001.parquet")
    bucket = s3_server.new_bucket()
    s3 = s3_server.client()
    for name, first in (("f.jsonl", 28), ("g.jsonl", 32)):
        s3.put_object(Bucket=bucket, Key=f"in/{name}", Body=jsonl_bytes(texts(docs, first)))
    recipe = root / "recipe.toml"
    recipe.write_text(
        f'tokenizer = "{tokenizer_path}"\nshard_tokens = 400\n'
        f'[sources.files]\ntype = "files"\npaths = ["{local}/*"]\n'
        f'[sources.hub]\ntype = "hf"\nrepo = "acme/notes"\nsplit = "train"\ntext_field = "content"\n'
        f'mirror = "{root / "mirror"}"\n'
        f'[sources.bucket]\ntype = "files"\npaths = ["s3://{bucket}/in/*.jsonl"]\n'
    )
    data = root / "data"
    prep = cli("prepare", str(recipe), "--out", str(data), "--workers", "1", env=s3_server.env)
    assert prep.returncode == 0, prep.stderr
    save = root / "ck"
    common = [
        *SMALL,
        "--manifest",
        str(data),
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--save",
        str(save),
    ]
    launch(*common, "--steps", str(STEPS), "--stop-at", "3", "--mix", "files=2,hub=1,bucket=1")
    launch(
        *common,
        "--steps",
        str(STEPS),
        "--resume",
        "--mix",
        "files=1,hub=2,bucket=2",
        procs=2,
        launcher="torchrun",
    )
    packed = root / "packed"
    launch(*SMALL, "--manifest", str(data), "--micro-batch", "2", "--global-batch", "4", "--save", str(packed),
           "--steps", "3", "--packing", "best-fit", "--packing-buffer", "16")  # fmt: skip
    return {
        "root": root,
        "data": data,
        "save": save,
        "records": traced_samples(save, SHOWN),
        "packed": traced_samples(packed, "1-20"),
        "s3": s3,
        "tok": tokenizer_path,
    }


def traced_samples(save: Path, steps: str) -> list[dict]:
    proc = cli("samples", str(save), "--steps", steps, "--origin", "--decode", "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def original(origin: dict, s3) -> str:
    """The text at ``origin`` read back from the input itself, by its own format."""
    name = origin["input"]
    if name.startswith("s3://"):
        bucket, key = name.removeprefix("s3://").split("/", 1)
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={origin['offset']}-")["Body"]
        return json.loads(got.read().split(b"\n", 1)[0])["text"]
    path = Path(name)
    if path.suffix == ".txt":
        assert origin["offset"] == 0
        return path.read_text()
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return table.column(table.column_names[-1])[origin["row"]].as_py()
    if "offset" in origin:
        with open(path, "rb") as f:
            f.seek(origin["offset"])
            return json.loads(f.readline())["text"]
    raw = path.read_bytes()
    raw = gzip.decompress(raw) if path.suffix == ".gz" else zstandard.ZstdDecompressor().decompress(raw)
    line = io.BytesIO(raw).readlines()[origin["line"] - 1]
    return json.loads(line)["text"]


def kind(name: str) -> str:
    if name.startswith("s3://"):
        return "bucket"
    if "/mirror/" in name:
        return "hub"
    return "".join(Path(name).suffixes)


def test_every_document_reads_back_from_its_input_as_decode_shows_it(traced):
    seen = read_back(traced, traced["records"])
    assert set(seen) == {".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".txt", "hub", "bucket"}, seen


def test_packed_samples_name_the_origin_of_each_piece(traced):
    assert any("padding" in rec for rec in traced["packed"])
    seen = read_back(traced, traced["packed"])
    assert sum(seen.values()) > len(traced["packed"])  # several whole documents per packed sample


def read_back(traced: dict, records: list[dict]) -> dict[str, int]:
    """Each document's text (its token range, decoded) found in the sample's --decode text and
    at its origin in the input; how many were checked, by kind of input."""
    tok = Tokenizer.from_file(str(traced["tok"]))
    m = manifest_mod.load(traced["data"])
    hashes = {s.rel_path: s.hash for s in m.shards}
    seen: dict[str, int] = {}
    for rec in records:
        for doc in rec["documents"]:
            o = doc["origin"]
            assert o["shard_hash"] == hashes[o["shard"]]
            if kind(o["input"]) == "hub":  # the repo, its revision and the file, as on the hub
                assert o["repo"] == "acme/notes" and o["revision"] and o["input"].endswith("/" + o["file"])
            ids = Shard(m.resolve(o["shard"]), m.dtype).document(o["shard_document"])[doc["from"] : doc["to"]]
            piece = tok.decode([i for i in ids.tolist() if i != m.eos_id], skip_special_tokens=False)
            if not piece.strip() or "\ufffd" in piece:
                continue  # a window edge inside a character
            assert piece in rec["text"], (o, piece)
            assert piece in original(o, traced["s3"]), (o, piece)
            seen[kind(o["input"])] = seen.get(kind(o["input"]), 0) + 1
    return seen


def test_the_training_api_names_the_same_origins(traced):
    from trainer.api import TrainingSamples

    api = TrainingSamples.from_checkpoint(traced["save"], micro_batch=2)
    for rec in traced["records"][:12]:
        for doc in rec["documents"]:
            assert api.origin(rec["source"], doc["id"]) == doc["origin"]


def test_the_run_changed_its_mix_and_its_ranks_half_way(traced):
    trained = [r for r in traced["records"] if r["trained"]]
    assert {r["step"] for r in trained} == set(range(1, STEPS + 1))
    assert {r["source"] for r in trained} == {"files", "hub", "bucket"}


def test_the_text_form_names_input_place_and_shard(traced):
    proc = cli("samples", str(traced["save"]), "--steps", "1", "--origin")
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "<-" in x]
    assert lines and all(" | shard " in x and "xxh3_128:" in x for x in lines)
    assert any(" offset " in x or " line " in x or " row " in x for x in lines)


def test_data_prepared_without_provenance_says_so_in_one_line(traced, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(traced["data"], old)
    path = old / manifest_mod.MANIFEST_NAME
    doc = json.loads(path.read_text())
    for shard in doc["shards"]:
        del shard["origin_hash"], shard["origin_bytes"]
    manifest_mod.write(old, {k: v for k, v in doc.items() if k != "checksum"})
    proc = cli("samples", str(traced["save"]), "--steps", "1", "--origin", "--manifest", str(old))
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "prepared without provenance" in line and "prepare it again" in line
    plain = cli("samples", str(traced["save"]), "--steps", "1", "--manifest", str(old))
    assert plain.returncode == 0, plain.stderr


def test_a_run_finished_over_an_older_tokshards_shards_refuses_only_the_samples_in_those(traced, tmp_path):
    """Every other shard as an older tokshard wrote it (no sidecar, none in the manifest), the
    others as this one does: as a run an older version began and this one finished leaves it."""
    mixed = tmp_path / "mixed"
    shutil.copytree(traced["data"], mixed)
    path = mixed / manifest_mod.MANIFEST_NAME
    doc = json.loads(path.read_text())
    untraced = set()
    for shard in doc["shards"][::2]:
        del shard["origin_hash"], shard["origin_bytes"]
        (mixed / shard["path"]).with_suffix(".origin").unlink()
        untraced.add(shard["path"])
    manifest_mod.write(mixed, {k: v for k, v in doc.items() if k != "checksum"})
    proc = cli(
        "samples",
        str(traced["save"]),
        "--steps",
        SHOWN,
        "--origin",
        "--decode",
        "--json",
        "--manifest",
        str(mixed),
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    touches = [any(d["origin"]["shard"] in untraced for d in r["documents"]) for r in traced["records"]]
    assert any(touches) and not all(touches)
    shown = [json.loads(line) for line in proc.stdout.splitlines()]
    assert shown == [r for r, t in zip(traced["records"], touches, strict=True) if not t]
    refused = [line for line in proc.stderr.splitlines() if "older tokshard" in line]
    assert len(refused) == sum(touches)
    for line, rec in zip(
        refused, [r for r, t in zip(traced["records"], touches, strict=True) if t], strict=True
    ):
        assert f"step {rec['step']} position {rec['position']}:" in line
        named = line.split(" shard ", 1)[1].split(" ", 1)[0]
        assert named in untraced and any(d["origin"]["shard"] == named for d in rec["documents"])
        assert "recorded no places" in line and "new folder" in line


def swap_two_inputs(sidecar: Path) -> None:
    """Rewrite a sidecar as a hand edit would: two of its inputs' names swapped, every entry
    count and place kept (so it parses, and names the wrong file for the documents of both)."""
    side = provenance.read(sidecar)
    names = [name for name, _ in side.inputs]
    inputs = [(names[1] if i == 0 else names[0] if i == 1 else n, u) for i, (n, u) in enumerate(side.inputs)]
    sidecar.write_bytes(provenance.encode(provenance.Origins(inputs, side.input_of, side.place)))


def test_a_sidecar_edited_since_prepare_is_refused_in_one_line_naming_it(traced, tmp_path):
    """A local sidecar is checked against the manifest's origin_hash, as one read through a
    manifest URL is: an edited one names no document's input wrongly."""
    edited = tmp_path / "edited"
    shutil.copytree(traced["data"], edited)
    m = manifest_mod.load(edited)
    sidecars = [s.origin_path for s in m.shards if len(provenance.read(s.origin_path).inputs) > 1]
    for sidecar in sidecars:
        swap_two_inputs(sidecar)
    proc = cli(
        "samples", str(traced["save"]), "--steps", SHOWN, "--origin", "--json", "--manifest", str(edited)
    )
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert (
        any(str(s) in line for s in sidecars) and "origin_hash" in line and "prepare the data again" in line
    )
    shown = [json.loads(x) for x in proc.stdout.splitlines()]
    assert shown == traced["records"][: len(shown)]  # what came before it, as the true sidecars say


def changed_inputs(traced: dict) -> dict[str, str]:
    """One input of each kind the record of a source can tell changed: a local .jsonl (a line
    added), an object (rewritten: a new ETag) and a hub mirror's file (touched); by kind."""
    root, s3 = traced["root"], traced["s3"]
    local = root / "in" / "a.jsonl"
    local.write_bytes(b'{"text": "a line added after prepare"}\n' + local.read_bytes())
    obj = next(r["documents"][0]["origin"]["input"] for r in traced["records"] if r["source"] == "bucket")
    bucket, key = obj.removeprefix("s3://").split("/", 1)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=b'{"text": "new first line"}\n' + body)
    mirror = next(Path(p) for p in (root / "mirror").rglob("*.parquet"))
    os.utime(mirror, ns=(mirror.stat().st_atime_ns, mirror.stat().st_mtime_ns + 10**9))
    return {".jsonl": str(local), "bucket": obj, "hub": os.path.realpath(mirror)}


def test_an_input_changed_since_prepare_is_said_once_and_its_origins_marked(traced):
    """The manifest records each input's size and time or ETag: an origin into an input that is
    no longer what prepare read is marked (input_changed), the input named once on stderr."""
    root, s3 = traced["root"], traced["s3"]
    saved = {
        p: (p.read_bytes(), p.stat())
        for p in [root / "in" / "a.jsonl", *(root / "mirror").rglob("*.parquet")]
    }
    objects = {(r["documents"][0]["origin"]["input"]) for r in traced["records"] if r["source"] == "bucket"}
    bodies = {
        o: s3.get_object(Bucket=o[5:].split("/", 1)[0], Key=o[5:].split("/", 1)[1])["Body"].read()
        for o in objects
    }
    try:
        changed = changed_inputs(traced)
        proc = cli("samples", str(traced["save"]), "--steps", SHOWN, "--origin", "--json")
        text = cli("samples", str(traced["save"]), "--steps", SHOWN, "--origin")
    finally:
        for path, (raw, st) in saved.items():
            path.write_bytes(raw)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        for o, body in bodies.items():
            s3.put_object(Bucket=o[5:].split("/", 1)[0], Key=o[5:].split("/", 1)[1], Body=body)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [x for x in proc.stderr.splitlines() if "since prepare" in x]
    assert len(said) == len(changed), said
    for name in changed.values():
        assert [
            x for x in said if f"input {name} changed since prepare" in x or f"file {name} changed" in x
        ], said
    assert all("may now hold other bytes" in x and "prepare the data again" in x for x in said)
    marked = set()
    for rec in map(json.loads, proc.stdout.splitlines()):
        for doc in rec["documents"]:
            o = doc["origin"]
            assert ("input_changed" in o) == (o["input"] in changed.values()), o
            marked |= {o["input"]} if "input_changed" in o else set()
    assert marked == set(changed.values())
    assert text.returncode == 0 and " (input changed since prepare) " in text.stdout
