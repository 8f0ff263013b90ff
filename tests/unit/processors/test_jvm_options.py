"""A path in the driver JVM's options stays one argument, spelled as it is."""

from __future__ import annotations

import shlex

import pytest

from refold.processors.runtime.jvm_options import path_option


@pytest.mark.parametrize(
    "path",
    [
        "/var/cache/refold-spark-0/123",
        "/Users/me/My Projects/refold/.jars/spark.jsa",
        "/a'b\"c d\\e",
    ],
)
def test_a_path_stays_one_argument_of_the_jvm(path: str) -> None:
    # Spark's launcher splits spark.driver.extraJavaOptions with a shell's quoting rules.
    options = f"-Dlog4j2.level=warn {path_option('-Djava.io.tmpdir=', path)} -Xlog:disable"
    assert shlex.split(options) == [
        "-Dlog4j2.level=warn",
        f"-Djava.io.tmpdir={path}",
        "-Xlog:disable",
    ]


def test_a_path_that_needs_no_quotes_is_written_as_it_is() -> None:
    assert path_option("-XX:SharedArchiveFile=", "/x/.jars/jvm/spark-4.1.1.jsa") == (
        "-XX:SharedArchiveFile=/x/.jars/jvm/spark-4.1.1.jsa"
    )
