"""The rerank model's scoring (model_source/rerank/1/model.py) against the formulas written out. Parity with
FlagEmbedding's compute_score through the real server: tests/test_m3.py."""
import numpy as np
import pytest

from conftest import import_python_model


@pytest.fixture(scope="module")
def rerank():
    return import_python_model("rerank")


def test_scores_match_their_formulas(rerank):
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = np.array([[0.6, 0.8]])
    assert rerank.colbert_score(q, p, padded_length=1) == pytest.approx((0.6 + 0.8) / 2)
    assert rerank.colbert_score(-q, p, padded_length=2) == 0.0  # a shorter passage of its batch: floored at 0
    assert rerank.colbert_score(-q, p, padded_length=1) == pytest.approx(-(0.6 + 0.8) / 2)
    sparse = rerank.sparse_score((np.array([1, 5, 9]), np.array([0.5, 1.0, 2.0])), (np.array([9, 2, 5]),
                                                                                   np.array([1.0, 3.0, 0.25])))
    assert sparse == pytest.approx(1.0 * 0.25 + 2.0 * 1.0)


def test_combined_score_weights_the_modes_and_leaves_the_others_nan(rerank):
    query = {"dense": np.array([1.0, 0.0]), "sparse": (np.array([3]), np.array([2.0]))}
    passages = [{"dense": np.array([0.6, 0.8]), "sparse": (np.array([3, 4]), np.array([0.5, 1.0]))},
                {"dense": np.array([0.0, 1.0]), "sparse": (np.array([4]), np.array([1.0]))}]
    combined, per_mode = rerank.scores(query, passages, {"dense": 1.0, "sparse": 3.0})
    assert per_mode[:, :2] == pytest.approx(np.array([[0.6, 1.0], [0.0, 0.0]]))
    assert np.isnan(per_mode[:, 2]).all()  # ColBERT not combined
    assert combined == pytest.approx([(0.6 + 3.0 * 1.0) / 4.0, 0.0])
