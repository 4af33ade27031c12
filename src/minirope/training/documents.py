"""Where documents come from: the bundled plays, text and record files, and `datasets` datasets.

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
import json
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


class JsonLinesFile(FileShard):
    """A `.jsonl` file (or a `.json` file of JSON lines): one document per line; locator `[byte offset, line]`."""

    def documents(self, start: object = None) -> Iterator[Document]:
        for locator, where, record in self.records(start):
            text = record_text(record, self.text_column, where)
            yield Document(locator, where, lambda at, text=text: text_from(text, at))

    def records(self, start: object = None) -> Iterator[tuple[list[int], str, object]]:
        """`(locator, where, parsed record)` for each non-blank line from locator `start`.

        Raises:
            ValueError: a line that is not UTF-8 or not JSON (naming the file and line).
        """
        offset, number = start or (0, 1)
        with open(self.path, "rb") as file:
            file.seek(offset)
            for raw in file:
                where = f"{self.path} line {number}"
                if raw.strip():
                    yield [offset, number], where, self.parse(raw, offset, where)
                offset, number = offset + len(raw), number + 1

    def parse(self, raw: bytes, offset: int, where: str) -> object:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise not_utf8(self.path, offset + error.start, raw[error.start]) from None
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not JSON ({error.msg}): write one object per line.") from None


class JsonArrayFile(FileShard):
    """A `.json` file holding one array of records (read whole); locator: the record's index."""

    def load(self) -> list:
        """The file's records.

        Raises:
            ValueError: not UTF-8, or not JSON (naming the line).
        """
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise not_utf8(self.path, error.start, error.object[error.start]) from None
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{self.path} is not JSON ({error.msg}, line {error.lineno}): write an array of records, or one "
                f"record per line."
            ) from None

    def documents(self, start: object = None) -> Iterator[Document]:
        records = self.load()
        for index in range(start or 0, len(records)):
            where = f"{self.path} record {index}"
            text = record_text(records[index], self.text_column, where)
            yield Document(index, where, lambda at, text=text: text_from(text, at))


def is_json_array(path: Path) -> bool:
    with open(path, "rb") as file:
        return file.read(4096).lstrip().startswith(b"[")


class ParquetFile(FileShard):
    """A `.parquet` file: one document per row of `text_column`; locator: the row index."""

    def __init__(self, path: str | Path, text_column: str) -> None:
        import pyarrow.parquet as pq

        super().__init__(path, text_column)
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as error:  # pyarrow raises several types for unreadable files
            raise ValueError(f"data file {path} is not a readable parquet file ({error}): check the file.") from None
        if text_column not in self.file.schema_arrow.names:
            raise ValueError(
                f"data file {path} has no column {text_column!r} (columns: {self.file.schema_arrow.names}): "
                f"pass the column that holds the text with --text_column."
            )

    def documents(self, start: object = None) -> Iterator[Document]:
        row, first = 0, start or 0
        for group in range(self.file.num_row_groups):
            rows = self.file.metadata.row_group(group).num_rows
            if row + rows <= first:
                row += rows
                continue
            column = self.file.read_row_group(group, columns=[self.text_column]).column(0)
            for index in range(max(0, first - row), rows):
                where = f"{self.path} row {row + index}"
                text = record_text({self.text_column: column[index].as_py()}, self.text_column, where)
                yield Document(row + index, where, lambda at, text=text: text_from(text, at))
            row += rows


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


def file_shard(path: str, text_column: str) -> Shard:
    """The shard that reads `path` by its suffix (see the module doc)."""
    suffix = Path(path).suffix
    if suffix == ".txt":
        return TextFile(path)
    if suffix == ".parquet":
        return ParquetFile(path, text_column)
    if suffix == ".json" and is_json_array(Path(path)):
        return JsonArrayFile(path, text_column)
    return JsonLinesFile(path, text_column)


def records(path: str) -> Iterator[tuple[str, object]]:
    """`(where, record)` for every record of a `.jsonl`, `.json` or `.parquet` file; `where` names the file and place.

    Raises:
        ValueError, OSError: the file is missing, empty, of another kind, or unreadable (naming the place).
    """
    shard = file_shard(path, text_column="")
    if isinstance(shard, JsonLinesFile):
        for _, where, record in shard.records():
            yield where, record
    elif isinstance(shard, JsonArrayFile):
        for index, record in enumerate(shard.load()):
            yield f"{path} record {index}", record
    elif isinstance(shard, ParquetFile):
        rows = (
            row for group in range(shard.file.num_row_groups) for row in shard.file.read_row_group(group).to_pylist()
        )
        for index, row in enumerate(rows):
            yield f"{path} row {index}", row
    else:
        raise ValueError(f"data file {path} is plain text, not records: give a .jsonl, .json or .parquet file.")


def record_fields(path: str) -> set[str]:
    """The fields of a file's first record; empty for a `.txt` file (plain text)."""
    if Path(path).suffix == ".txt":
        return set()
    first = next(records(path), (None, {}))[1]
    return set(first) if isinstance(first, dict) else set()


def all_text(shards: list[Shard]) -> Iterator[tuple[str, str]]:
    """`(document name, text chunk)` for every chunk of every document of `shards`, in order."""
    for shard in shards:
        for document in shard.documents():
            for chunk in document.read(0):
                yield document.name, chunk
