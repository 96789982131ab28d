"""A bucket in another region than the client's: one line naming the region to set. The S3 stand-in
(moto) serves every region alike, so the message is read from pyarrow's own error text, which the
second test finds in the installed libarrow (it fails when pyarrow's wording changes)."""

from __future__ import annotations

from pathlib import Path

import pyarrow

from raydp_llm.core.storage import OTHER_REGION, unreachable

# pyarrow 25's whole error for a HEAD of a bucket in eu-west-1 from a client in us-east-1
ARROW_ERROR = ("When getting information for bucket 'corpus': AWS Error UNKNOWN (HTTP status 301) "
               "during HeadBucket operation: No response body. Looks like the configured region is "
               "'us-east-1' while the bucket is located in 'eu-west-1'.")


def test_a_bucket_in_another_region_names_the_region_to_set():
    err = unreachable("data.path", "s3://corpus/a/", OSError(ARROW_ERROR))
    assert str(err) == ("data.path=s3://corpus/a/: the bucket is in the region eu-west-1, not the "
                        "one this client uses; set s3.region=eu-west-1 (or AWS_REGION)")
    other = unreachable("data.path", "s3://corpus/a/", OSError("AWS Error ACCESS_DENIED"))
    assert "cannot read it (AWS Error ACCESS_DENIED); check the URI" in str(other)


def test_pyarrow_still_words_the_other_region_so():
    library = next(Path(pyarrow.__file__).parent.glob("libarrow.so.*"))
    assert b"' while the bucket is located in '" in library.read_bytes()
    assert OTHER_REGION.search("while the bucket is located in 'ap-southeast-2'")[1] == (
        "ap-southeast-2")
