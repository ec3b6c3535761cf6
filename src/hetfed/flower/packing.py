"""A message's records packed into one Flower array: what travels when ``flower.packed_messages`` is on.

Flower (1.20 and later) moves a message as a tree of content-addressed objects — the message, its
``RecordDict``, every record, every array and every 5 MB chunk of an array — each pushed and pulled with its own
request at every hop (ServerApp → SuperLink → SuperNode → ClientApp process, and back). A hetfed training message
is ~25 such objects (a model's tensors are an array each, and the broadcast, the run's config, the clients named
and the evaluation riding along are records of their own) where Flower's own minimal App sends ~5; on a loopback
deployment those requests, not the bytes, were what put a hetfed round above Flower's floor (#50).

Packed, the same ``RecordDict`` travels in Flower's own protobuf encoding (``flwr.common.serde``) as the bytes
of one array in one ``ArrayRecord`` (:data:`PACKED`): five objects for a message of any shape, more chunks only
for models over Flower's chunk size. Nothing is lost or converted — :func:`unpack` gives back the records
:func:`pack` was given, bit for bit — so every reader of a message is unchanged. A node answers in the form it was
asked (:func:`hetfed.flower.client_app.as_asked`), so a server that sends records as they are (SecAgg+'s rounds, whose
mod reads and masks
the records themselves; ``flower.packed_messages = false``) gets them back as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

#: the one record of a packed message, and its one array's key and serialisation type
PACKED, KEY, STYPE = "hetfed.packed", "recorddict", "flwr.proto.RecordDict"


def pack(records: Mapping[str, Any]) -> RecordDict:
    """``records`` (a ``RecordDict`` or a dict of records) as one array of their protobuf bytes."""
    data = recorddict_to_proto(RecordDict(dict(records))).SerializeToString()
    return RecordDict({PACKED: ArrayRecord({KEY: Array(dtype="uint8", shape=(len(data),), stype=STYPE, data=data)})})


def is_packed(content: RecordDict) -> bool:
    return PACKED in content.array_records and len(content) == 1


def unpack(content: RecordDict) -> RecordDict:
    """The records :func:`pack` packed; a content that is not packed, as it is."""
    if not is_packed(content):
        return content
    array = content.array_records[PACKED][KEY]
    if array.stype != STYPE:
        raise ValueError(f"a packed hetfed message holds stype {array.stype!r}; expected {STYPE!r}")
    return recorddict_from_proto(RecordDictProto.FromString(array.data))



def unpack_replies(replies: Iterable[Message]) -> None:
    """Each reply's records, unpacked in place (a node answers in the form it was asked: packed or not)."""
    for reply in replies:
        if reply.has_content():
            reply.content = unpack(reply.content)
