"""The broker's faults: one publish refused, an ack that comes late, a delivery
repeated, deliveries out of order; each seen by the caller and in the log."""

from __future__ import annotations

import time

import pytest

from mock_tool.client import ToolClient
from mock_tool.errors import ToolOutcomeUnknown, ToolRejected


def test_publish_fail_refuses_one_message_of_a_batch(client: ToolClient) -> None:
    fault_id = client.set_fault("broker", "publish_fail", skip=1)
    client.publish("ev-1", "t", {})
    with pytest.raises(ToolOutcomeUnknown) as info:
        client.publish("ev-2", "t", {})
    assert info.value.http_status == 503
    client.publish("ev-3", "t", {})
    export = client.export()
    assert [m["event_id"] for m in export["messages"]] == ["ev-1", "ev-3"]
    [refused] = export["refused_publishes"]
    assert (refused["event_id"], refused["fault_id"], refused["http_status"]) == (
        "ev-2",
        fault_id,
        503,
    )


def test_publish_ack_late_takes_the_message_late(client: ToolClient) -> None:
    client.set_fault("broker", "publish_ack_late", ms=500)
    impatient = ToolClient(client.base_url, timeout_s=0.2)
    with pytest.raises(ToolOutcomeUnknown):
        impatient.publish("ev-late", "t", {})
    assert client.broker_messages() == []  # not taken yet when the caller gave up
    time.sleep(0.5)
    [msg] = client.export()["messages"]
    assert (msg["event_id"], msg["fault_mode"]) == ("ev-late", "publish_ack_late")
    assert msg["received_at"] - msg["arrived_at"] >= 0.5


def test_create_faults_never_fire_on_the_broker(client: ToolClient) -> None:
    client.set_fault("*", "reject_429")
    client.publish("ev-x", "t", {})  # the broker ignores a tool fault
    with pytest.raises(ToolRejected):
        client.create("plain", "op", "r", 1, {})
    with pytest.raises(ToolRejected):
        client.set_fault("broker", "reject_429")
    with pytest.raises(ToolRejected):
        client.set_fault("plain", "publish_fail")


def test_deliver_duplicate_repeats_the_first_message_of_one_read(client: ToolClient) -> None:
    s1 = client.publish("ev-1", "t", {})
    s2 = client.publish("ev-2", "t", {})
    fault_id = client.set_fault("broker", "deliver_duplicate")
    assert [m["seq"] for m in client.broker_messages()] == [s1, s2, s1]
    assert [m["seq"] for m in client.broker_messages()] == [s1, s2]  # the fault is spent
    first, second = client.export()["deliveries"]
    assert (first["seqs"], first["event_ids"], first["fault_id"]) == (
        [s1, s2, s1],
        ["ev-1", "ev-2", "ev-1"],
        fault_id,
    )
    assert (second["seqs"], second["fault_id"]) == ([s1, s2], None)


def test_deliver_reorder_hands_one_read_out_in_reverse(client: ToolClient) -> None:
    seqs = [client.publish(f"ev-{i}", "t", {}) for i in range(3)]
    client.set_fault("broker", "deliver_reorder")
    assert client.broker_messages(after=999) == []  # an empty read takes no fault
    assert [m["seq"] for m in client.broker_messages()] == seqs[::-1]
    empty, delivery = client.export()["deliveries"]
    # The empty read is logged too (where a read began shows what it passed over).
    assert (empty["after_seq"], empty["seqs"], empty["fault_mode"]) == (999, [], None)
    assert (delivery["seqs"], delivery["fault_mode"]) == (seqs[::-1], "deliver_reorder")


def test_publish_nack_answers_200_without_taking_the_message(client: ToolClient) -> None:
    """A negative acknowledgement: 200 with ``ack: false``, nothing stored; the
    client raises, so no caller takes it for an acknowledgement."""
    fault_id = client.set_fault("broker", "publish_nack")
    with pytest.raises(ToolRejected) as info:
        client.publish("ev-nack", "t", {})
    assert info.value.http_status == 200 and info.value.retryable
    client.publish("ev-next", "t", {})
    export = client.export()
    assert [m["event_id"] for m in export["messages"]] == ["ev-next"]
    [refused] = export["refused_publishes"]
    assert (refused["event_id"], refused["fault_id"], refused["http_status"]) == (
        "ev-nack",
        fault_id,
        200,
    )
