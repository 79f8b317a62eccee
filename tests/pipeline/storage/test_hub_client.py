"""The hub client's retry lines are left out while tokshard asks the hub
(`pipeline.storage.hub_client`): unreachable, a command printed eleven lines of them before
its own one."""

from __future__ import annotations

import logging

from pipeline.storage.hub_client import RETRIES, quiet


def test_the_clients_retry_warnings_are_left_out_and_its_errors_kept(caplog):
    retries = logging.getLogger(RETRIES)
    with caplog.at_level(logging.WARNING, logger=RETRIES), quiet(RETRIES):
        retries.warning("Retrying in 1s [Retry 1/5].")
        retries.error("a failure the client itself reports")
    assert [r.getMessage() for r in caplog.records] == ["a failure the client itself reports"]


def test_the_loggers_level_is_back_afterwards(caplog):
    retries = logging.getLogger(RETRIES)
    before = retries.level
    with quiet(RETRIES):
        pass
    assert retries.level == before
    with caplog.at_level(logging.WARNING, logger=RETRIES):
        retries.warning("Retrying in 2s [Retry 2/5].")
    assert [r.getMessage() for r in caplog.records] == ["Retrying in 2s [Retry 2/5]."]
