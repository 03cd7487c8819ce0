"""PYTORCH_ALLOC_CONF parsing follows torch's parser: values, bracket lists, errors."""

from __future__ import annotations

import pytest

from memprobe.allocator.config import (
    AllocConf,
    alloc_conf_from_env,
    parse_alloc_conf,
)
from memprobe.errors import UserError


def test_defaults_for_empty_text():
    conf = parse_alloc_conf("")
    assert conf == AllocConf()
    assert conf.max_split_size is None
    assert conf.max_non_split_rounding == 20 << 20
    assert conf.large_segment_size == 20 << 20
    assert conf.to_string() == ""


def test_every_modelled_option():
    conf = parse_alloc_conf(
        "max_split_size_mb:512, max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,"
        "expandable_segments:True,roundup_power2_divisions:4,per_process_memory_fraction:0.5"
    )
    assert conf.max_split_size == 512 << 20
    assert conf.max_non_split_rounding == 64 << 20
    assert conf.garbage_collection_threshold == 0.6
    assert conf.expandable_segments is True
    assert conf.roundup_power2_divisions == (4,) * 16
    assert conf.per_process_memory_fraction == 0.5


def test_bracket_divisions_fill_below_the_first_and_after_the_last():
    conf = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    table = conf.roundup_power2_divisions
    assert table[:9] == (1,) * 9  # every interval up to [256 MiB, 512 MiB)
    assert table[9] == 2  # [512 MiB, 1 GiB)
    assert table[10:] == (4,) * 6
    assert conf.divisions_for(300 << 20) == 1
    assert conf.divisions_for(600 << 20) == 2
    assert conf.divisions_for(2 << 30) == 4
    assert conf.divisions_for(1000) == 1  # sizes under 2 MiB use the first interval


@pytest.mark.parametrize(
    "text",
    [
        "expandable_segments:True,max_split_size_mb:300",
        "roundup_power2_divisions:[256:1,512:2,>:4]",
        "roundup_power2_divisions:[1:2,64:8,>:1],garbage_collection_threshold:0.25",
        "roundup_power2_divisions:[2:0,4:8,1024:2,>:0]",
        "backend:cudaMallocAsync",
        "large_segment_size_mb:12,release_lock_on_cudamalloc:True",
    ],
)
def test_to_string_round_trips(text):
    conf = parse_alloc_conf(text)
    assert parse_alloc_conf(conf.to_string()) == conf


def test_malloc_async_is_recognised_but_not_modelled():
    conf = parse_alloc_conf("backend:cudaMallocAsync")
    assert conf.backend == "cudaMallocAsync"
    assert not conf.is_modelled


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("max_split_size_mb:10", "at least 20"),
        ("max_non_split_rounding_mb:1", "at least 20"),
        ("garbage_collection_threshold:1.5", "between 0 and 1"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("roundup_power2_divisions:[3:2]", "powers of 2"),
        ("roundup_power2_divisions:[256:1", "closing"),
        ("expandable_segments:yes", "True or False"),
        ("backend:magic", "unknown backend"),
        ("max_split_size:512", "unknown option"),
        ("max_split_size_mb", "expected ':'"),
        ("max_split_size_mb:lots", "whole number"),
        ("expandable_segments:True,", "stray"),
    ],
)
def test_bad_settings_raise_user_error_with_hint(text, words):
    with pytest.raises(UserError) as info:
        parse_alloc_conf(text)
    assert words in info.value.message
    assert info.value.hint


def test_env_prefers_the_cuda_name_as_torch_does():
    # torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF first (c10 AllocatorConfig.cpp, round 34).
    env = {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
    }
    assert alloc_conf_from_env(env) == AllocConf(max_split_size_mb=128)
    assert alloc_conf_from_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == AllocConf(
        max_split_size_mb=128
    )
    assert alloc_conf_from_env({}) == AllocConf()
