"""The token dtypes a shard may hold, defined once (stdlib only, so the command line offers
them without loading numpy): name -> (numpy dtype string, Megatron dtype code in the .idx).

uint32 ids get Megatron's int32 code 4, as Megatron has no code for uint32.
"""

from __future__ import annotations

TOKEN_DTYPES: dict[str, tuple[str, int]] = {
    "uint16": ("<u2", 8),
    "uint32": ("<u4", 4),
}
