"""doit's dependency file keeps doit's own fields of every task and drops what only the
run that made it reads: a stage's returned dict, which doit stores twice."""

from __future__ import annotations

import json

from hefbuild.cli.depfile import SlimCodec

STAGE = {"outcome": "restored", "key": "ab" * 32, "seconds": 0.01, "why": "not in build/"}


def test_a_stage_keeps_doits_fields_and_loses_its_result():
    db = {"fetch:m": {"_values_:": STAGE, "result:": STAGE, "checker:": "DigestChecker",
                      "deps:": [], "ignore:": "1"},
          "export:m": {"_values_:": STAGE, "result:": STAGE, "checker:": "DigestChecker",
                       "deps:": []},
          "written before": {"checker:": "DigestChecker", "deps:": []},
          "mine": {"_values_:": {"n": 3}, "result:": "0123", "deps:": ["in.txt"],
                   "in.txt": "digest"}}
    codec = SlimCodec()
    back = codec.decode(codec.encode(db))
    assert back == {"fetch:m": {"checker:": "DigestChecker", "deps:": [], "ignore:": "1"},
                    "mine": db["mine"]}  # a task of the user's own keeps its values
    # export:m, and a stage's record an earlier run left slim: nothing in them that doit
    # reads differently from no record at all
    assert json.loads(codec.encode(db)) == back  # plain JSON, as doit's codec writes


def test_one_record_at_a_time_as_the_dbm_backend_writes():
    codec = SlimCodec()
    assert codec.decode(codec.encode({"_values_:": STAGE, "deps:": []})) == {}
    assert codec.decode(codec.encode({"_values_:": STAGE, "ignore:": "1"})) == {"ignore:": "1"}
    assert codec.decode(codec.encode({"_values_:": {"n": 3}})) == {"_values_:": {"n": 3}}
    assert codec.decode(codec.encode([1, "x"])) == [1, "x"]
