"""A message's records packed into one Flower array (``flower.packed_messages``): lossless through Flower's own
object transfer, a handful of objects whatever the records, and a node answers in the form it was asked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents  # noqa: E402

from hetfed.flower.packing import PACKED, is_packed, pack, unpack  # noqa: E402


def _over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` as Flower moves it: every object deflated to bytes, then inflated from those bytes alone."""
    objects = get_all_nested_objects(content)
    contents = {oid: obj.deflate() for oid, obj in objects.items()}
    return inflate_object_from_contents(content.object_id, contents)  # type: ignore[return-value]


def _same(a: RecordDict, b: RecordDict) -> None:
    assert list(a.keys()) == list(b.keys())
    for name, record in a.items():
        other = b[name]
        assert type(record) is type(other), name
        if isinstance(record, ArrayRecord):
            assert list(record.keys()) == list(other.keys())
            for key, arr in record.items():
                got = other[key]
                assert (arr.dtype, tuple(arr.shape), arr.stype, arr.data) == (got.dtype, tuple(got.shape), got.stype,
                                                                              got.data), (name, key)
        else:
            assert dict(record) == dict(other), name
            for key, value in dict(record).items():  # an int stays an int, bytes stay bytes
                assert type(dict(other)[key]) is type(value), (name, key)


def _training_message() -> RecordDict:
    """What hetfed's server sends a node in a round (a model's tensors, the broadcast, the run, the clients, the
    last round's evaluation riding along) — built by hetfed's own record functions."""
    import torch

    from hetfed.engine.types import Broadcast
    from hetfed.flower.records import CLIENTS, EVALUATE_FIRST, RUN, broadcast_to_records

    torch.manual_seed(0)
    params = {f"layer{i}.{kind}": torch.randn(16, 8) if kind == "weight" else torch.randn(16)
              for i in range(3) for kind in ("weight", "bias")}
    content = broadcast_to_records(Broadcast(params, 3, 0.05, {"beta": 0.5, "synthetic": torch.randn(4, 8)}))
    content[RUN] = ConfigRecord({"config": "x" * 3000, "method": 0})
    content[CLIENTS] = ConfigRecord({"ids": [0, 1, 2], "offset": 0})
    content[EVALUATE_FIRST] = ConfigRecord({"ids": [0, 1], "among": [0, 1, 2, 3]})
    return RecordDict(content)


def test_a_training_message_packs_into_four_objects_and_comes_back_bit_for_bit_through_flowers_transfer():
    content = _training_message()
    packed = pack(content)
    # Flower's own object tree: one per record, array and chunk unpacked (+ the Message around either)
    assert len(get_all_nested_objects(content)) == 1 + len(content) + 2 * sum(
        len(r) for r in content.array_records.values()
    )
    assert len(get_all_nested_objects(packed)) == 4  # RecordDict, ArrayRecord, Array, ArrayChunk
    assert is_packed(packed) and not is_packed(content)
    _same(content, unpack(_over_the_wire(packed)))
    assert unpack(content) is content  # what is not packed is read as it is


@st.composite
def _records(draw) -> RecordDict:
    scalars = st.one_of(st.integers(-2**62, 2**62), st.floats(allow_nan=False), st.text(max_size=20),
                        st.binary(max_size=20), st.booleans())
    out: dict = {}
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["arrays", "config", "metric"]))
        if kind == "arrays":
            dtype = draw(st.sampled_from(["float32", "float64", "int64", "uint8", "float16"]))
            shapes = draw(st.lists(st.lists(st.integers(0, 5), max_size=3), max_size=3))
            out[f"a{i}"] = ArrayRecord({f"t{j}": Array(np.arange(int(np.prod(s)), dtype=dtype).reshape(s))
                                        for j, s in enumerate(shapes)})
        elif kind == "config":
            out[f"c{i}"] = ConfigRecord(draw(st.dictionaries(st.text(min_size=1, max_size=8), scalars, max_size=4)))
        else:
            numbers = st.one_of(st.integers(-2**62, 2**62), st.floats(allow_nan=False),
                                st.lists(st.floats(allow_nan=False), max_size=4))
            out[f"m{i}"] = MetricRecord(draw(st.dictionaries(st.text(min_size=1, max_size=8), numbers, max_size=4)))
    return RecordDict(out)


@settings(max_examples=60, deadline=None)
@given(_records())
def test_any_records_come_back_as_they_were_packed(content):
    _same(content, unpack(_over_the_wire(pack(content))))


def test_a_node_answers_in_the_form_it_was_asked():
    from hetfed.flower.client_app import as_asked

    seen: list[RecordDict] = []

    @as_asked
    def echo(message: Message, context: Context) -> Message:
        seen.append(message.content)
        return Message(RecordDict({"reply": ConfigRecord({"got": sorted(message.content.keys())})}), reply_to=message)

    import flwr.app.message as flwr_message

    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    records = RecordDict({"x": ConfigRecord({"a": 1}), "y": ArrayRecord({"t": Array(np.ones(3, dtype=np.float32))})})
    for packed in (True, False):
        message = flwr_message.make_message(metadata=_metadata(), content=pack(records) if packed else records)
        reply = echo(message, context)
        assert list(seen[-1].keys()) == ["x", "y"]  # the handler reads the records themselves
        assert is_packed(reply.content) is packed
        assert dict(unpack(reply.content)["reply"]) == {"got": ["x", "y"]}
        assert (PACKED in reply.content) is packed


def _metadata():
    from flwr.app import Metadata

    return Metadata(run_id=1, message_id="m1", src_node_id=0, dst_node_id=7, reply_to_message_id="", group_id="",
                    created_at=0.0, ttl=3600.0, message_type="train")


def test_a_model_over_flowers_chunk_size_travels_in_chunks_and_comes_back_whole():
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE as chunk

    big = np.random.default_rng(0).standard_normal(3 * chunk // 8).astype(np.float32)  # 1.5 chunks of floats
    content = RecordDict({"params": ArrayRecord({"w": Array(big)}), "bc": ConfigRecord({"round": 1})})
    packed = pack(content)
    data = len(packed.array_records[PACKED]["recorddict"].data)
    assert len(get_all_nested_objects(packed)) == 3 + -(-data // chunk)  # RecordDict, ArrayRecord, Array, chunks
    got = unpack(_over_the_wire(packed))
    _same(content, got)
    np.testing.assert_array_equal(got.array_records["params"]["w"].numpy(), big)


class _EchoGrid:
    """A grid whose every node answers each message with its content (as a ClientApp handler wrapped by
    :func:`hetfed.flower.client_app.as_asked` would: in the form it was asked)."""

    def __init__(self) -> None:
        self.pushed: list[bool] = []  # each message's content packed, as it was pushed
        self.replies: list[Message] = []

    def push_messages(self, messages):
        from hetfed.flower.client_app import as_asked

        @as_asked
        def echo(message: Message, context: Context) -> Message:
            return Message(RecordDict(dict(message.content)), reply_to=message)

        ids = []
        for i, m in enumerate(messages):
            m.metadata.__dict__["_message_id"] = f"m{i}"
            self.pushed.append(is_packed(m.content))
            reply = echo(m, Context(run_id=1, node_id=m.metadata.dst_node_id, node_config={}, state=RecordDict(),
                                    run_config={}))
            reply.metadata.__dict__["_src_node_id"] = m.metadata.dst_node_id
            self.replies.append(reply)
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, ids):
        return [r for r in self.replies if r.metadata.reply_to_message_id in set(ids)]


@pytest.mark.parametrize("packed", [True, False])
def test_the_server_sends_packed_or_as_records_as_configured_and_reads_the_records_back(monkeypatch, packed):
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.config import build_config
    from hetfed.flower.executor import FlowerExecutor

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    grid = _EchoGrid()
    executor = FlowerExecutor(grid, build_config({"flower": {"packed_messages": packed}}), 0)
    content = _training_message()
    replies = executor._send([(3, content, "train"), (4, content, "train")], timeout=5.0)
    assert grid.pushed == [packed, packed]
    for node in (3, 4):
        reply = replies[node]
        assert reply is not None and not is_packed(reply.content)
        _same(content, reply.content)  # what the node got and echoed is what the server meant to send


@pytest.mark.parametrize("streamed", [False, True])
def test_an_upload_read_back_on_the_servers_device_holds_every_tensor_there(streamed):
    """The server screens and sums the nodes' uploads against its own parameters: on a GPU run they must come back
    on its device (``meta`` stands for one here), updates, sample counts (the weights of its mean) and per-client
    extras alike."""
    import torch

    from hetfed.engine.types import StreamedUpload, Upload
    from hetfed.flower.records import records_to_upload, upload_to_records

    extra = {"train_loss": torch.tensor([0.5, 0.25])}
    params = {"w": torch.ones(2, 3)}
    up = (StreamedUpload([0, 1], {}, torch.tensor([3.0, 4.0]), extra, {"norm": 0}, {"w": torch.ones(3)}) if streamed
          else Upload([0, 1], params, torch.tensor([3.0, 4.0]), extra))
    back = records_to_upload(RecordDict(upload_to_records(up)), "meta")
    tensors = [back.num_samples, *back.params.values(), *back.extra.values(), *(back.mean.values() if streamed else ())]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert back.client_ids == [0, 1]
