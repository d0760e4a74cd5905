"""Reading a user's text file (a config, a catalog, a CSV, a model's config.json) so that every
way it can fail ends in a one-line :class:`SpecError` naming the file: missing, a directory or a
device, too large to be a config, not UTF-8, not YAML."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import yaml

from clustersim.hardware_specs.errors import SpecError

MAX_BYTES = 64 * 2**20
"""No config, catalog or table the tool reads comes near this; /dev/zero would never end."""


def read_text(path: Path | str, field: str = "", errors: str = "strict") -> str:
    """The file's text; ``errors="replace"`` for logs, where a stray byte is no reason to stop."""
    path = Path(path)
    try:
        if not path.exists():
            raise SpecError(field, f"cannot read {path}: no such file")
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "a special file"
            raise SpecError(field, f"expected a file, got {kind}: {path}")
        if path.stat().st_size > MAX_BYTES:
            raise SpecError(field, f"{path} is over {MAX_BYTES // 2**20} MiB; expected a text file")
        return path.read_bytes().decode("utf-8", errors)
    except UnicodeDecodeError:
        raise SpecError(field, f"{path} is not a UTF-8 text file") from None
    except OSError as err:
        raise SpecError(field, f"cannot read {path}: {err.strerror or err}") from None


def load_yaml(path: Path | str, field: str = "") -> Any:
    """A YAML file's data; a syntax error is one line with its position."""
    try:
        return yaml.safe_load(read_text(path, field))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError(field, f"{path} is not valid YAML: {problem}{where}") from None
    except SpecError:
        raise                           # read_text's own message (a ValueError too)
    except (ValueError, RecursionError) as err:
        raise SpecError(field, f"{path}: {_unreadable(err)}") from None


def load_json(path: Path | str, field: str = "") -> Any:
    """A JSON file's data; a syntax error is one line with its position."""
    try:
        return json.loads(read_text(path, field))
    except json.JSONDecodeError as err:
        raise SpecError(field, f"{path} is not valid JSON: {err.msg} (line {err.lineno}, "
                               f"column {err.colno})") from None
    except SpecError:
        raise
    except (ValueError, RecursionError) as err:
        raise SpecError(field, f"{path}: {_unreadable(err)}") from None


def _unreadable(err: Exception) -> str:
    """Why a syntactically valid file still cannot be read: structures nested past Python's
    recursion limit, or an integer past its digit limit (``sys.set_int_max_str_digits``)."""
    if isinstance(err, RecursionError):
        return "nested too deeply to read"
    return f"a value cannot be read ({str(err).split(';')[0]})"


def read_csv_rows(path: Path | str, field: str = "") -> list[dict[str, str]]:
    """A CSV file's rows as mappings by header; a malformed record (an unclosed quote, a field
    past the csv module's limit) is one line naming the file and the record."""
    reader = csv.DictReader(io.StringIO(read_text(path, field), newline=""))
    try:
        return list(reader)
    except csv.Error as err:
        raise SpecError(field, f"{path}: near line {reader.line_num}: not valid CSV ({err})"
                        ) from None
