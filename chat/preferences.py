"""Per-chat settings, personas, the active persona and drafts (specs/chat.md §1, §4).

Settings are one record per (chat, name), so two devices changing different settings of one
chat offline both keep theirs. Personas are a per_item set of at most 50 custom ones beside
built-ins that are never stored; the active persona, and a chat's, fall back to the default
when the custom persona they name is gone. Drafts stay on the device, written as a chain:
a save stamped earlier than the stored one is late, and dropped.
"""

from __future__ import annotations

import time
from typing import Any

from chat.base import ChatBase
from chat.ids import check_id
from chat.models import Draft, Persona, Setting, build, parse, to_document
from chat.schema import ACTIVE_PERSONA, DRAFTS, PERSONAS, SETTINGS
from replica import REGISTER_ID, InvalidArgumentError

DEFAULT_PERSONA = "default"
BUILTIN_PERSONAS = {DEFAULT_PERSONA: Persona(name="Default", prompt="")}


class Preferences(ChatBase):
    """Settings, personas and drafts of `ChatStore`."""

    # -- settings ------------------------------------------------------------------------------

    def set_setting(self, thread: str, name: str, value: Any) -> None:
        """Set one setting of a chat (None deletes it)."""
        setting = build(Setting, thread=check_id("chat", thread), name=name, value=value)
        if "/" in name:  # as an import refuses it (chat/limits.py)
            raise InvalidArgumentError(f"setting name {name!r:.60} holds '/'")
        with self._operation(thread, undo="setting"):
            self._thread(thread)
            record_id = f"{thread}/{name}"
            record = self.replica.get(SETTINGS, record_id, profile=self.profile)
            context = None if record is None else record.context
            if value is not None or (record is not None and not record.deleted):
                document = None if value is None else to_document(setting)
                self._write(SETTINGS, record_id, document, before=record, context=context)

    def settings(self, thread: str) -> dict[str, Any]:
        where = {"thread": check_id("chat", thread)}
        records = self.replica.scan(SETTINGS, profile=self.profile, where=where)
        parsed = [parse(Setting, r.document, f"setting {r.id}") for r in records]
        return {s.name: s.value for s in parsed if s.thread == thread}

    def _delete_preferences(self, thread: str) -> None:
        """The settings and the draft of a chat being deleted (inside its transaction)."""
        where = {"thread": thread}
        for record in self.replica.scan(SETTINGS, profile=self.profile, where=where):
            self._write(SETTINGS, record.id, None, before=record, context=record.context)
        if self.replica.get(DRAFTS, thread, profile=self.profile) is not None:
            self.replica.delete(DRAFTS, thread, profile=self.profile)

    # -- personas ------------------------------------------------------------------------------

    def create_persona(self, name: str, prompt: str = "") -> str:
        """A custom persona's id; `ItemLimitError` past 50."""
        persona = build(Persona, name=name, prompt=prompt)
        persona_id = self._new_id()
        self.replica.put(PERSONAS, persona_id, to_document(persona), profile=self.profile)
        return persona_id

    def update_persona(self, persona: str, *, name: str, prompt: str) -> None:
        record = self.replica.get(PERSONAS, self._custom(persona), profile=self.profile)
        if record is None or record.deleted:
            raise InvalidArgumentError(f"no persona {persona}")
        updated = build(Persona, **{**record.document, "name": name, "prompt": prompt})
        self.replica.put(
            PERSONAS, persona, to_document(updated), profile=self.profile, context=record.context
        )

    def delete_persona(self, persona: str) -> None:
        self.replica.delete(PERSONAS, self._custom(persona), profile=self.profile)

    def personas(self) -> dict[str, Persona]:
        """The built-in personas, then the custom ones by id."""
        custom = {
            r.id: parse(Persona, r.document, f"persona {r.id}")
            for r in self.replica.scan(PERSONAS, profile=self.profile)
        }
        return {**BUILTIN_PERSONAS, **custom}

    def persona(self, persona: str | None) -> tuple[str, Persona]:
        """The persona `persona` names, or the default when it is none or gone."""
        if persona is not None and persona in BUILTIN_PERSONAS:
            return persona, BUILTIN_PERSONAS[persona]
        if persona is not None:
            record = self.replica.get(PERSONAS, check_id("persona", persona), profile=self.profile)
            if record is not None and not record.deleted:
                return persona, parse(Persona, record.document, f"persona {persona}")
        return DEFAULT_PERSONA, BUILTIN_PERSONAS[DEFAULT_PERSONA]

    def set_active_persona(self, persona: str) -> None:
        if persona not in BUILTIN_PERSONAS:
            self._custom(persona)
        self.replica.put(ACTIVE_PERSONA, REGISTER_ID, {"persona": persona}, profile=self.profile)

    def active_persona(self) -> tuple[str, Persona]:
        record = self.replica.get(ACTIVE_PERSONA, REGISTER_ID, profile=self.profile)
        chosen = None
        if record is not None and not record.deleted and isinstance(record.document, dict):
            value = record.document.get("persona")
            chosen = value if isinstance(value, str) else None
        return self.persona(chosen)

    def _custom(self, persona: str) -> str:
        if persona in BUILTIN_PERSONAS:
            raise InvalidArgumentError(f"persona {persona!r} is built in: it cannot be changed")
        return check_id("persona", persona)

    # -- drafts --------------------------------------------------------------------------------

    @staticmethod
    def draft_stamp() -> int:
        """Take this when the user types; pass it to `save_draft` however late that runs."""
        return time.time_ns()

    def save_draft(self, thread: str, text: str, stamp: int) -> bool:
        """Keep the draft of a chat, on this device only, unless a save stamped later is
        stored already (a late debounced save never brings back a cleared draft); whether
        it was kept. An empty text clears it."""
        draft = build(Draft, stamp=stamp, text=text)
        with self._operation(check_id("chat", thread)):
            record = self.replica.get(DRAFTS, thread, profile=self.profile)
            stored = None
            if record is not None and not record.deleted:
                stored = parse(Draft, record.document, f"draft {thread}")
            if stored is not None and stored.stamp >= stamp:
                return False
            self.replica.put(DRAFTS, thread, to_document(draft), profile=self.profile)
        return True

    def draft(self, thread: str) -> str:
        record = self.replica.get(DRAFTS, check_id("chat", thread), profile=self.profile)
        if record is None or record.deleted:
            return ""
        return parse(Draft, record.document, f"draft {thread}").text
