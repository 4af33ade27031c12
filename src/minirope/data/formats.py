"""Record files: `.jsonl` (JSON lines), `.json` (one array of records, read whole) and `.parquet`, one document per
record (its `text_column` field); choosing a file's shard by its suffix (`file_shard`); and a file's records for the
commands that read fields other than text (prompt/completion pairs, conversations). Errors name the file and the
place: the line of a bad JSON record, the row whose text is not a string."""

import json
from collections.abc import Iterator
from pathlib import Path

from minirope.data.documents import (
    Document,
    FileShard,
    Shard,
    TextFile,
    not_utf8,
    read_utf8,
    record_text,
    text_from,
)


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
        text = read_utf8(self.path)
        try:
            return json.loads(text)
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
