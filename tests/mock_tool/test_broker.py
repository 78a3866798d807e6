"""The broker logs every publish before acking and keeps duplicates."""

from __future__ import annotations

from mock_tool.client import ToolClient


def test_publish_is_acked_in_order_and_duplicates_are_kept(client: ToolClient) -> None:
    s1 = client.publish("ev-1", "runs", {"rev": 1})
    s2 = client.publish("ev-2", "runs", {"rev": 2})
    s3 = client.publish("ev-1", "runs", {"rev": 1})  # at-least-once relay repeats
    assert s1 < s2 < s3
    messages = client.broker_messages()
    assert [(m["seq"], m["event_id"], m["payload"]) for m in messages] == [
        (s1, "ev-1", {"rev": 1}),
        (s2, "ev-2", {"rev": 2}),
        (s3, "ev-1", {"rev": 1}),
    ]
    # The duplicate is visible as such, not silently merged.
    assert [m["duplicate_of"] for m in messages] == [None, None, s1]
    assert [m["seq"] for m in client.broker_messages(after=s1)] == [s2, s3]
    assert [m["seq"] for m in client.broker_messages(after=0, limit=1)] == [s1]
    assert client.export()["messages"] == messages
