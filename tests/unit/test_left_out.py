"""What a chat or preference ETL left out, said as the console, manifest.json and summary.json
say it, and the share past which a run stops (data/left_out.py)."""

from __future__ import annotations

from raydp_llm.data.left_out import LeftOut, said


def test_conversations_left_out_are_counted_by_reason_with_the_setting_that_keeps_them(caplog):
    chat = {"conversations": 90, "dropped": 6, "no_assistant": 4, "truncated": 3,
            "record_tokens": 257}
    left = LeftOut.of(chat)
    assert left.to_json() == {"unit": "conversations", "read": 100, "kept": 90,
                              "left_out": {"dropped": 6, "no_assistant": 4}}
    assert left.line() == ("left out 10 of 100 conversations: 6 longer than model.block_size + 1 "
                           "= 257 tokens (raise model.block_size, or set data.overlong=truncate); "
                           "4 with no assistant turn to train on (set data.train_on=all)")
    assert said(chat, 0.1) is None and left.line() in caplog.text  # a tenth: said, not refused
    refused = said(chat, 0.09)
    assert str(refused).startswith("data: the run would leave out 10 of 100 conversations (10%, "
                                   "more than data.max_dropped=0.09): 6 longer than")
    assert str(refused).endswith("; or set data.max_dropped=1 to train on the rest")


def test_nothing_left_out_is_said_quietly_and_other_data_has_no_count(caplog):
    assert said({"pairs": 5, "identical": 0, "record_tokens": 65}, 0.0) is None
    assert "left out" not in caplog.text
    assert LeftOut.of(None) is None and said(None, 0.0) is None
