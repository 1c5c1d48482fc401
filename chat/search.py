"""Search over chat titles and message bodies (specs/chat.md §6).

Documents are decrypted on demand: the first search of a store reads every chat and message
of its profile once, and keeps their titles and texts (case-folded) in memory, up to
`MAX_CACHED_CHARS`; later searches first read the change feed from where the cache stands
and refresh only the records that changed, so a warm search touches no envelope that did
not change. Past the bound, or after a feed reset, the cache is dropped and rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chat.base import ChatBase
from chat.models import Message, Thread, parse
from chat.schema import MESSAGES, THREADS
from replica import FeedResetError, InvalidArgumentError

MAX_HITS = 30
MAX_CACHED_CHARS = 64 * 1024 * 1024
MAX_QUERY_CHARS = 200


@dataclass(frozen=True)
class Hit:
    """A chat whose title matched (`message` None), or one of its messages."""

    thread: str
    message: str | None
    text: str


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    """At most 30: titles first, then messages, newest first."""
    total: int
    """Every match, past the 30 shown."""


@dataclass
class _Corpus:
    cursor: str
    titles: dict[str, tuple[str, str]] = field(default_factory=dict)
    """chat id → (title, folded title)"""
    bodies: dict[str, tuple[str, int, str, str]] = field(default_factory=dict)
    """message id → (chat id, at, text, folded text)"""
    chars: int = 0


class Searching(ChatBase):
    """`search` of `ChatStore`, with its cache."""

    _corpus: _Corpus | None
    """The cache (dropped when the replica locks); `_corpus_lock` guards it. Both are made
    by `ChatBase`."""
    _locks: int

    def search(self, query: str) -> SearchResult:
        """Chats and messages whose text contains `query` (case-insensitive)."""
        if not isinstance(query, str) or not 1 <= len(query) <= MAX_QUERY_CHARS:
            raise InvalidArgumentError(
                f"a search query has 1..{MAX_QUERY_CHARS} characters, got {query!r:.60}"
            )
        folded = query.casefold()
        with self._corpus_lock:
            corpus = self._fresh_corpus()
            titles = [Hit(t, None, title) for t, (title, f) in corpus.titles.items() if folded in f]
            bodies = sorted(
                (b for b in corpus.bodies.items() if folded in b[1][3]),
                key=lambda item: item[1][1],
                reverse=True,
            )
        hits = titles + [Hit(chat, message, text) for message, (chat, _, text, _) in bodies]
        return SearchResult(hits[:MAX_HITS], len(hits))

    def _fresh_corpus(self) -> _Corpus:
        locks = self._locks
        corpus = self._corpus
        if corpus is not None:
            try:
                self._refresh(corpus)
            except FeedResetError:
                corpus = None
        if corpus is None or corpus.chars > MAX_CACHED_CHARS:
            corpus = self._build()
        kept = corpus.chars <= MAX_CACHED_CHARS and locks == self._locks  # not once locked
        self._corpus = corpus if kept else None
        return corpus

    def _build(self) -> _Corpus:
        corpus = _Corpus(self.replica.feed_head())
        for record in self.replica.scan(THREADS, profile=self.profile):
            self._take_thread(corpus, record.id, record.document)
        for record in self.replica.scan(MESSAGES, profile=self.profile):
            self._take_message(corpus, record.id, record.document)
        return corpus

    def _refresh(self, corpus: _Corpus) -> None:
        while True:
            page = self.replica.changes(corpus.cursor)
            for change in page.changes:
                identity = change.identity
                if identity is None or identity.profile != self.profile:
                    continue
                if identity.collection in (THREADS, MESSAGES):
                    self._retake(corpus, identity.collection, identity.id)
            corpus.cursor = page.cursor
            if not page.more:
                return

    def _retake(self, corpus: _Corpus, collection: str, id: str) -> None:
        record = self.replica.get(collection, id, profile=self.profile)
        document = None if record is None or record.deleted else record.document
        if collection == THREADS:
            old = corpus.titles.pop(id, None)
            corpus.chars -= 0 if old is None else len(old[0])
            if document is not None:
                self._take_thread(corpus, id, document)
        else:
            gone = corpus.bodies.pop(id, None)
            corpus.chars -= 0 if gone is None else len(gone[2])
            if document is not None:
                self._take_message(corpus, id, document)

    @staticmethod
    def _take_thread(corpus: _Corpus, id: str, document: object) -> None:
        title = parse(Thread, document, f"chat {id}").title
        corpus.titles[id] = (title, title.casefold())
        corpus.chars += len(title)

    @staticmethod
    def _take_message(corpus: _Corpus, id: str, document: object) -> None:
        """Keep a message's text. Only the three fields search uses are checked here (a full
        validation per message made a cold search 1.6 times a plain decrypting scan); a
        message whose fields are not as the store writes them is parsed to say why."""
        fields = document if isinstance(document, dict) else {}
        thread, at, content = fields.get("thread"), fields.get("at"), fields.get("content")
        if type(thread) is not str or type(at) is not int or type(content) is not str:
            message = parse(Message, document, f"message {id}")
            thread, at, content = message.thread, message.at, message.content
        corpus.bodies[id] = (thread, at, content, content.casefold())
        corpus.chars += len(content)
