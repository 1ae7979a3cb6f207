"""The label of ``recordprep infer``'s draft: its kind from the sample, or, without
``--label``, none and the candidate named.

A label is never chosen silently: a field named like one (``clicked``, ``y``)
may be a feature or a leak, and a model trained on the wrong target fails
quietly; so the draft names the candidate and the user names the label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from convert.infer_yaml import Draft, Names
from convert.paths import one_value_path, parse_path, render_path
from convert.records import walk_path

if TYPE_CHECKING:
    from convert.infer import _FieldStats

#: Names (lowercased) of fields a draft without ``--label`` names as the label's candidate.
LABEL_NAMES = ("label", "target", "y", "clicked", "class", "outcome")
#: An integer label with at most this many values is a class id (int64); past it, a regression target.
LABEL_MAX_CLASSES = 100


def candidate_draft(path: str, st: _FieldStats, total: int) -> Draft:
    """The label's line of a draft made without ``--label``: no label, the candidate named."""
    kind = label_draft(path, st, total, Names()).comment.removeprefix(f"{path}: ")
    why = (f"none without --label; {path!r} looks like one ({kind}); rerun with --label {path} to draft it, "
           f"or name yours; {path!r} is left out of the features so it cannot leak into the inputs")
    return Draft(None, why, path, role="label",
                 warnings=[f"no --label given: the draft has no label; candidate {path!r} ({kind}): rerun with "
                           f"--label {path}"])


def label_draft(path: str, st: _FieldStats, total: int, names: Names) -> Draft:
    """The label's draft: its kind from the sample (strings: class names, ``transform:
    vocabulary``; few integer values: class ids, int64; other numbers: float32), or
    no entry for values that cannot be a label, with warnings for what convert would reject."""
    types = set(st.types) - {"null"}
    distinct = len(st.distinct)
    warnings = []
    missing = st.nulls + (total - st.count)
    if missing and types:
        warnings.append(f"label {path!r} is null or absent in {missing} of {total} sampled records: convert rejects "
                        f"such records (OUTPUT/errors/; the run fails unless --max-errors/--max-error-fraction "
                        f"tolerates them); filter them out first or pick another label")
    if st.nonfinite:
        warnings.append(f"label {path!r} is NaN, infinite or beyond float32 in {st.nonfinite} sampled records: "
                        f"convert rejects them (labels must be finite)")
    name = names.claim(path)
    entry: dict[str, Any] | None = {"source": path}
    if name != path.replace(".", "_"):
        entry["name"] = name
    if types and types <= {"int", "bool"} and distinct <= LABEL_MAX_CLASSES:
        entry["dtype"] = "int64"
        why = f"{path}: integer with {distinct} values: class ids (int64)"
    elif types and types <= {"int", "float", "bool"}:
        entry["dtype"] = "float32"
        why = (f"{path}: integer with {distinct}{'+' if st.capped else ''} values (more than "
               f"{LABEL_MAX_CLASSES}): a regression target (float32); use dtype: int64 if they are class ids"
               if types <= {"int", "bool"} else f"{path}: numeric: a regression target (float32)")
    elif types == {"str"}:
        entry["transform"] = "vocabulary"
        more = "+" if st.capped else ""
        shown = ", ".join(sorted(map(str, st.distinct))[:5]) + (", ..." if distinct > 5 else "")
        why = (f"{path}: strings ({distinct}{more} distinct: {shown}): class names, ids 0..K-1 by training "
               f"frequency (the class names are in the metadata)")
        if distinct > LABEL_MAX_CLASSES:
            warnings.append(f"label {path!r} has {distinct}{more} distinct strings in the sample: is it an identifier "
                            f"rather than a class? Each becomes a class of the model's output")
    else:
        entry = None
        if not types:
            why = f"{path} is always null in the sample; it cannot be the label"
        else:
            why = f"{path} holds {', '.join(sorted(types))} values; a label is one number per record"
        warnings.insert(0, why)
    return Draft(entry, why, path, role="label", warnings=warnings)


def label_path_problem(label: str, records: Sequence[Any], schemas: Sequence[Any]) -> str | None:
    """Why convert's config check would refuse ``label`` as the label's ``source``, or None.

    The same checks as a config's label: the path grammar (``y[0]``, ``n.a``,
    ``m["k"]``), one value per record, and then the data: each Avro writer
    schema in ``schemas`` (``convert.check.avro_problems``: the path exists, and
    holds a kind a label can be), else the sampled ``records`` (some record has
    the path). Checked as a vocabulary label (the kind that takes the most
    types), since the draft picks the label's kind from the values afterwards.
    A missing path's message names close paths of the data ("did you mean").
    A path holding a list (an Avro array; a list in some sampled JSON record) is
    refused alike for both inputs, suggesting one item (``y[0]``): convert would
    reject every record whose label is a list, and a draft without the label
    would hide that. A JSON object there is refused too, suggesting a field, as
    the Avro check refuses a record.
    """
    from convert.check import avro_problems, avro_types_at, sample_paths, sample_problems
    from convert.config_checks import single_path_problem
    from convert.config_model import Config, LabelConfig

    problem = single_path_problem(label, "the label")
    if problem:
        return problem
    config = Config(features=(), label=LabelConfig(source=label, name="label", transform="vocabulary"))
    if schemas:
        for schema in schemas:
            lists = sorted({what for kind, what in avro_types_at(schema, label) if kind == "array"})
            if lists:
                return _list_label_problem(label, f"{' or '.join(lists)} in the Avro schema")
            found = avro_problems(config, schema)
            if found:
                return f"in the Avro schema: {found[0]}"
        return None
    found = sample_problems(config, sample_paths(records), len(records))
    if found:
        return found[0]
    steps = parse_path(label)
    values = [walk_path(r, steps) for r in records if isinstance(r, dict)]
    lists = sum(isinstance(v, list) for v in values)
    if lists:
        return _list_label_problem(label, f"a list in {lists} of {len(values)} sampled records")
    objects = [v for v in values if isinstance(v, dict)]
    if objects:  # as the Avro check says of a record
        field = render_path((*steps, next(iter(objects[0]), "FIELD")))
        return (f"the label {label!r} holds an object (a record or map) in {len(objects)} of {len(values)} "
                f"sampled records; a label is one value per record: read one of its fields, e.g. {field!r}")
    return None


def _list_label_problem(label: str, where: str) -> str:
    """What ``infer --label`` says of a label path that holds a list (``where``: how the data
    shows it), for JSON Lines and Avro alike: convert would reject every such record."""
    return (f"the label {label!r} holds {where}; a label is one value per record: read one item, "
            f"e.g. {one_value_path(label)!r} (the first; [-1] the last)")

