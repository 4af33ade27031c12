"""Documents and shards: `.txt` files, in-memory texts and `datasets` datasets (record files: `records.py`).

A **document** is one whole text: a play of the bundled corpus, a `.txt` file, one record (row) of a
`.jsonl`/`.json`/`.parquet` file or of a `datasets` dataset. A **shard** is one source of documents (one file,
one list of texts, one dataset split). Every shard can start reading at any document, and every document at
any UTF-8 byte offset of its text, so that a stream can return to any point of a corpus (resume) without
reading what comes before it.

A `.txt` document is never held whole: it is read in chunks of `CHUNK_BYTES` from the file, so a document
larger than memory is fine. A record is held whole while it is read (it is one JSON line or one row).

Files are named by what they hold, and read by it in every mode:

    .txt                 one document per file (UTF-8 text)
    .jsonl, .json        one document per record, its `text_column` field: JSON lines, or (.json) one array
                         of records (read whole: use .jsonl for large files)
    .parquet             one document per row, its `text_column` column

Errors name the file and the place: a byte offset where a `.txt` stops being UTF-8, the line of a bad JSON
record, the row whose text is not a string.
"""

import codecs
import glob
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 1 << 20
SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Document:
    """One document of a shard.

    Attributes:
        locator: where the document starts in its shard (JSON-serialisable; `Shard.documents(locator)` starts
            there): 0 for a `.txt` file, `[byte offset, line number]` of a JSON line, a row index, ...
        name: what error messages call it (`file.jsonl line 12`).
        read: its text from a UTF-8 byte offset (a character boundary), as an iterator of chunks.
    """

    locator: object
    name: str
    read: Callable[[int], Iterator[str]]


class Shard:
    """A source of documents, readable from any of them (`documents(start)`)."""

    name: str

    def documents(self, start: object = None) -> Iterator[Document]:
        """The documents from the one at locator `start` (None: the first), in order."""
        raise NotImplementedError


def text_from(text: str, offset: int) -> Iterator[str]:
    """An in-memory document's text from UTF-8 byte `offset`, as one chunk."""
    yield text.encode("utf-8")[offset:].decode("utf-8") if offset else text


def check_file(path: str | Path) -> Path:
    """The path of a data file that exists, is a file and is not empty.

    Raises:
        FileNotFoundError, IsADirectoryError, ValueError: naming the file and the fix.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"data file {path} is a directory: give the files in it (e.g. '{path}/*.txt').")
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist: check the path.")
    if path.stat().st_size == 0:
        raise ValueError(f"data file {path} is empty: give a file that holds text.")
    if path.suffix not in SUFFIXES:
        raise ValueError(
            f"data file {path} is not {', '.join(SUFFIXES)}: name a plain-text file .txt, or convert it to one "
            f"of the record formats."
        )
    return path


def not_utf8(path: Path, offset: int, byte: int) -> ValueError:
    return ValueError(
        f"data file {path} is not UTF-8 text (byte 0x{byte:02x} at offset {offset}): convert it, e.g. "
        f"`iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}`."
    )


def read_utf8(path: str | Path) -> str:
    """A whole file's text, for files read at once (JSON arrays, demonstrations).

    Raises:
        ValueError: the file is not UTF-8 (`not_utf8`: the byte, its offset and a command that converts it).
    """
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(path, error.start, error.object[error.start]) from None


class FileShard(Shard):
    """A shard that is one file, checked (`check_file`) when the shard is made; records' text is `text_column`."""

    def __init__(self, path: str | Path, text_column: str = "text") -> None:
        self.path = check_file(path)
        self.name = str(path)
        self.text_column = text_column


class TextFile(FileShard):
    """A `.txt` file: one document, read in chunks of `CHUNK_BYTES` (never whole)."""

    def documents(self, start: object = None) -> Iterator[Document]:
        yield Document(0, self.name, self.read)

    def read(self, offset: int = 0) -> Iterator[str]:
        """The text from UTF-8 byte `offset`.

        Raises:
            ValueError: the file stops being UTF-8 (naming the byte offset), or holds only white space.
        """
        decoder = codecs.getincrementaldecoder("utf-8")()
        position, has_text = offset, offset > 0
        with open(self.path, "rb") as file:
            file.seek(offset)
            while True:
                data = file.read(CHUNK_BYTES)
                pending = decoder.getstate()[0]  # the bytes of a character cut by the previous chunk
                try:
                    text = decoder.decode(data, final=not data)
                except UnicodeDecodeError as error:
                    at = position - len(pending) + error.start
                    raise not_utf8(self.path, at, (pending + data)[error.start]) from None
                position += len(data)
                has_text = has_text or (bool(text) and not text.isspace())
                if text:
                    yield text
                if not data:
                    break
        if not has_text:
            raise ValueError(f"data file {self.path} is empty: give a file that holds text.")


def record_text(record: object, text_column: str, where: str) -> str:
    """The text of one record (a dict), naming `where` if it has none.

    Raises:
        ValueError: no `text_column` field, or one that is not a string.
    """
    if not isinstance(record, dict) or text_column not in record:
        raise ValueError(
            f"{where} has no {text_column!r} field: pass the field that holds the text with --text_column."
        )
    text = record[text_column]
    if not isinstance(text, str):
        raise ValueError(f"{where}: {text_column!r} is {type(text).__name__}, not text: fix or drop that record.")
    return text


class Texts(Shard):
    """Documents held in memory (the bundled plays, a loaded dataset split); locator: the index."""

    def __init__(self, texts, names, name: str) -> None:
        self.texts, self.names, self.name = texts, names, name

    def documents(self, start: object = None) -> Iterator[Document]:
        for index in range(start or 0, len(self.texts)):
            text = self.texts[index]
            if not isinstance(text, str):
                raise ValueError(
                    f"document {self.names[index]} is not text but {type(text).__name__}: fix or drop that row, or "
                    f"pass the column that holds the text with --text_column."
                )
            yield Document(index, self.names[index], lambda at, text=text: text_from(text, at))


class DatasetStream(Shard):
    """A `datasets.IterableDataset` (e.g. a Hub dataset with `streaming=True`): one document per row, its
    `text_column`; locator: the dataset's own `state_dict()` before the row."""

    def __init__(self, dataset, text_column: str, name: str) -> None:
        self.dataset, self.text_column, self.name = dataset, text_column, name
        self.initial_state = dataset.state_dict()

    def documents(self, start: object = None) -> Iterator[Document]:
        self.dataset.load_state_dict(self.initial_state if start is None else start)
        locator = self.dataset.state_dict()
        for index, row in enumerate(self.dataset):
            where = f"{self.name} row {index}" if start is None else f"{self.name} (resumed) row +{index}"
            text = record_text(row, self.text_column, where)
            yield Document(locator, where, lambda at, text=text: text_from(text, at))
            locator = self.dataset.state_dict()


def expand_files(patterns: list[str], flag: str = "--train_file") -> list[str]:
    """Paths and globs (`data/shard-*.jsonl`) -> the files, each pattern's matches sorted, in pattern order; each
    checked (`check_file`) before any is read.

    Raises:
        FileNotFoundError: a pattern matches no file, or a path does not exist.
        IsADirectoryError, ValueError: a path is a directory, an empty file or of an unsupported suffix.
    """
    files = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(path for path in glob.glob(pattern, recursive=True) if Path(path).is_file())
            if not matches:
                raise FileNotFoundError(f"{flag} {pattern} matches no file: check the path or the glob.")
        else:
            matches = [pattern]
        for path in matches:
            check_file(path)
        files.extend(matches)
    return files


def all_text(shards: list[Shard]) -> Iterator[tuple[str, str]]:
    """`(document name, text chunk)` for every chunk of every document of `shards`, in order."""
    for shard in shards:
        for document in shard.documents():
            for chunk in document.read(0):
                yield document.name, chunk
