"""Unit tests of the error contract (model_library/model_errors.py): what a model's error says (kind, field) is read
back exactly, through the words Triton's ensemble puts before it, and Triton's own untagged errors get their kind."""
import pytest

from model_library import model_errors


@pytest.mark.parametrize("kind, field, problem", [
    ("invalid_input", "documents[3]", "is empty"),
    ("invalid_input", "spans[2]", "[3, 1] ends before it starts"),  # brackets in the problem itself
    ("not_served", "dimensions", "77 is not served; dimensions must be one of 1024, 512"),
    ("too_many", "documents", "holds 3000 documents, over the limit of 2048 [sic]"),
    ("timeout", None, "the request's timeout expired before its next step"),
])
def test_a_tagged_error_reads_back_through_the_ensembles_prefix(kind, field, problem):
    message = model_errors.tagged(kind, field, problem)
    for seen in (message, f"in ensemble 'ensemble', {message}", message + "\n"):
        info = model_errors.parse(seen)
        assert (info.kind, info.field) == (kind, field), seen
        if field:  # the message leads with its field: the ensemble's words go
            assert model_errors.problem(info) == problem and info.message == f"{field} {problem}", seen
        else:  # no field to lead with: the message is kept whole
            assert info.message.endswith(problem) and "[" not in info.message, seen


@pytest.mark.parametrize("message, kind", [
    ("Exceeds maximum queue size", "overloaded"),
    ("Request timeout expired", "timeout"),
    ("Request for unknown model: 'x' is not found", "unavailable"),
    ("in ensemble 'e', Failed to process the request(s) for model 'tokenizer_0_0', message: Stub process "
     "'tokenizer_0_0' is not healthy.", "internal"),
    ("numbers [1, 2]", "internal"),  # brackets, but no tag: an unknown kind is no tag
    ("dimensions bad [bogus dimensions]", "internal"),
])
def test_an_untagged_error_gets_its_kind_from_tritons_wording(message, kind):
    info = model_errors.parse(message)
    assert (info.kind, info.field, info.message) == (kind, None, message)


def test_fields_split_into_name_and_index():
    assert model_errors.split_field("documents[3]") == ("documents", 3)
    assert model_errors.split_field("dimensions") == ("dimensions", None)
    assert model_errors.split_field("text[x]") == ("text[x]", None)
    with pytest.raises(ValueError):
        model_errors.tagged("bogus", "text", "is bad")
    assert set(model_errors.CLIENT_KINDS) <= set(model_errors.KINDS)
