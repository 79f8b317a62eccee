"""gcp-storage-emulator with GCS's generation precondition on uploads: ``python gcs_preconditions.py
start --host H --port P --in-memory`` (the emulator's own arguments).

The emulator as published stores every upload whatever its ``ifGenerationMatch``; GCS stores one
only where the object's generation is the one named (``0``: no object has the name) and answers
412 otherwise. tokshard's run lease on gs:// rests on that answer, so its tests need a server
that gives it. The emulator serves one request at a time, so the check and the write below are
one step, as GCS's are.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

#: GCS's answer where a precondition does not hold
CONDITION_NOT_MET = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"domain": "global", "reason": "conditionNotMet", "locationType": "header",
                    "location": "If-Match", "message": "At least one of the pre-conditions you specified did not hold."}],
    }
}  # fmt: skip

_published_insert = objects.insert


def _object_name(request) -> str | None:
    """The uploaded object's name: in the query, or in the metadata part of a multipart or
    resumable upload."""
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    meta = data.get("meta", data) if isinstance(data, dict) else None
    return meta.get("name") if isinstance(meta, dict) else None


def _generation(storage, bucket: str, name: str) -> str:
    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return "0"


def insert_if_the_generation_matches(request, response, storage, *args, **kwargs):
    """The emulator's upload, refused with GCS's 412 where ``ifGenerationMatch`` does not hold."""
    wanted = request.query.get("ifGenerationMatch")
    name = _object_name(request)
    if wanted and name is not None and _generation(storage, request.params["bucket_name"], name) != wanted[0]:
        response.status = HTTPStatus.PRECONDITION_FAILED
        response.json(CONDITION_NOT_MET)
        return None
    return _published_insert(request, response, storage, *args, **kwargs)


def with_preconditions() -> None:
    """Route every upload the emulator takes through the check (its routing table holds the
    handler itself, and a bare ``/o`` POST falls back to ``objects.insert``)."""
    objects.insert = insert_if_the_generation_matches
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is _published_insert:
                handlers[method] = insert_if_the_generation_matches


if __name__ == "__main__":
    with_preconditions()
    main(sys.argv[1:])
