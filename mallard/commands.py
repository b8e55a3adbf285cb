"""Commands (INTERFACE 4.6): track events whose name (any case) asks for a send or a journey.

The one definition of the command names, used by the collector's admission and validation and
by the dispatcher, and the collector's check of a command against the assets and journeys of
the config dir (`CommandCatalog`: asset ids and channels read from the asset.toml files, journey
ids and their step ids from `journeys/*.toml`, re-read when they change, looked at most once a
second).
"""

from __future__ import annotations

import os
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mallard.assets import asset_channels, assets_dir
from mallard.config import config_dir
from mallard.errors import InvalidRequest

# Each send command and the channel of the assets it sends.
SEND_CHANNELS = {
    "send_email": "email",
    "send_sms": "sms",
    "send_print": "print",
    "send_push": "push",
}
# The send command of each channel (a journey's send step sends its asset's channel).
SEND_COMMAND = {channel: command for command, channel in SEND_CHANNELS.items()}
START_JOURNEY = "start_journey"
COMMANDS = frozenset({*SEND_CHANNELS, START_JOURNEY})
# How often the catalog looks whether config/assets or config/journeys changed.
RECHECK_S = 1.0


def command_of(event: Any) -> str | None:
    """The command an event name is (lower case), or None."""
    if not isinstance(event, str):
        return None
    name = event.lower()
    return name if name in COMMANDS else None


@dataclass(frozen=True)
class Snapshot:
    signature: tuple[Any, ...]
    assets: dict[str, str | None]  # assetId -> channel (None: its asset.toml does not load)
    journeys: frozenset[str]
    # journeyId -> its step ids, as its file lists them (empty when the file does not parse:
    # the journey is still known, and `mallard journeys check` says what is wrong)
    steps: dict[str, frozenset[str]]


def _step_ids(path: Path) -> frozenset[str]:
    """The step ids a journey file lists; no full validation (mallard.journeys does that)."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return frozenset()
    steps = doc.get("steps")
    if not isinstance(steps, list):
        return frozenset()
    return frozenset(s["id"] for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str))


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class CommandCatalog:
    """The asset ids (with their channels) and journey ids a command may name."""

    def __init__(
        self,
        directory: Path | None = None,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.recheck_s = recheck_s
        self.clock = clock  # seconds, monotonic: when the files were last looked at
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._checked = 0.0

    def _signature(self, root: Path) -> tuple[Any, ...]:
        assets, journeys = assets_dir(root), root / "journeys"
        sig: list[Any] = [_stat(assets), _stat(journeys)]
        if assets.is_dir():
            for d in sorted(assets.iterdir()):
                sig.append((d.name, _stat(d / "asset.toml")))
        if journeys.is_dir():
            for f in sorted(journeys.glob("*.toml")):
                sig.append((f.name, _stat(f)))
        return tuple(sig)

    def refresh(self, force: bool = False) -> Snapshot:
        """The current snapshot; the files are looked at when `force` or a second has passed."""
        now = self.clock()
        snap = self._snapshot
        if snap is not None and not force and now - self._checked < self.recheck_s:
            return snap
        with self._lock:
            root = self.directory or config_dir()
            sig = self._signature(root)
            if self._snapshot is None or self._snapshot.signature != sig:
                journeys_dir = root / "journeys"
                files = sorted(journeys_dir.glob("*.toml")) if journeys_dir.is_dir() else []
                steps = {p.stem: _step_ids(p) for p in files}
                self._snapshot = Snapshot(sig, asset_channels(root), frozenset(steps), steps)
            self._checked = now
            return self._snapshot

    def check(self, command: str, msg: dict[str, Any], where: str = "") -> None:
        """InvalidRequest naming the field unless the command names a known asset of its
        channel, or a known journey (and, when it names one, a step of it)."""
        snap = self.refresh()
        if command == START_JOURNEY:
            props = msg.get("properties")
            journey = props.get("journeyIdToTrigger") if isinstance(props, dict) else None
            if not isinstance(journey, str) or not journey:
                raise InvalidRequest(
                    f'{where}"properties.journeyIdToTrigger" is required for start_journey'
                )
            if journey not in snap.journeys:
                raise InvalidRequest(
                    f'{where}"properties.journeyIdToTrigger": unknown journey {journey!r}'
                )
            if isinstance(props, dict) and "stepIdToTrigger" in props:
                step = props["stepIdToTrigger"]
                if not isinstance(step, str) or not step:
                    raise InvalidRequest(
                        f'{where}"properties.stepIdToTrigger" must be a step id of journey '
                        f"{journey!r}"
                    )
                if step not in snap.steps.get(journey, frozenset()):
                    raise InvalidRequest(
                        f'{where}"properties.stepIdToTrigger": unknown step {step!r} of '
                        f"journey {journey!r}"
                    )
            return
        asset_id = msg.get("assetId")
        if not isinstance(asset_id, str) or not asset_id:
            raise InvalidRequest(f'{where}"assetId" is required for {command}')
        if asset_id not in snap.assets:
            raise InvalidRequest(f'{where}"assetId": unknown asset {asset_id!r}')
        channel, wanted = snap.assets[asset_id], SEND_CHANNELS[command]
        if channel is None:
            raise InvalidRequest(
                f'{where}"assetId": the asset.toml of {asset_id!r} does not load; '
                "run `mallard assets check`"
            )
        if channel != wanted:
            raise InvalidRequest(
                f'{where}"assetId": {asset_id!r} is {_article(channel)} {channel} asset; '
                f"{command} sends {wanted} assets"
            )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


_default: CommandCatalog | None = None


def command_catalog() -> CommandCatalog:
    """The process's catalog of the config dir (`$MALLARD_CONFIG_DIR`, see mallard.config)."""
    global _default
    if _default is None:
        _default = CommandCatalog()
    return _default


def check_command(msg: dict[str, Any], where: str = "") -> None:
    """For a track: InvalidRequest when it is a command naming no valid asset or journey."""
    command = command_of(msg.get("event"))
    if command is not None:
        command_catalog().check(command, msg, where)
