"""What a capture manager shows where PyTorch users look: Dynamo's counters and profiler traces."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters


def compiled(fn, **options):
    return torch.compile(fn, backend="npugraph_ex", dynamic=True, options=options or None)


@torch.no_grad()
def test_dynamo_counters_count_captures_replays_and_why() -> None:
    counters.clear()
    fn = compiled(lambda x: x.sin() + 1, capture_limit=1)
    for rows in (2, 2, 2, 3, 3):
        fn(torch.randn(rows, 4))
    mirrored = dict(counters["npugraph_ex"])
    assert mirrored == {
        "captures": 1,
        "replays": 2,
        "eager_calls": 2,
        "eager_calls:capture_limit": 2,
    }


@torch.no_grad()
def test_dynamo_counters_count_recaptures_and_failed_calls() -> None:
    counters.clear()
    embedding = torch.nn.Embedding(10, 4)
    fn = compiled(embedding, force_recapture=True)
    fn(torch.tensor([1, 2]))
    fn(torch.tensor([3, 4]))
    try:
        fn(torch.tensor([1, 30]))
    except IndexError:
        pass
    mirrored = counters["npugraph_ex"]
    assert (mirrored["captures"], mirrored["recaptures"]) == (2, 1)
    assert mirrored["recaptures:force_recapture"] == 1
    assert mirrored["failed_calls:capture failed"] == 1


@torch.no_grad()
def test_profiler_traces_show_capture_and_replay_ranges() -> None:
    fn = compiled(lambda x: x.cos() * 2)
    x = torch.randn(3, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn(x)
        fn(x)
    names = [event.name for event in profile.events() if event.name.startswith("npugraph_ex.")]
    assert [name.split(" ")[0] for name in names] == ["npugraph_ex.capture", "npugraph_ex.replay"]
    assert names[1].endswith("key0: shapes=[3x4] values=[3, 4]"), names
