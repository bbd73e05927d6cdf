"""The JVM reader of segments (``format("segments-jvm")``): its jar, built here from source.

The Java sources under ``src/`` are compiled with the machine's ``javac``
against the jars the pyspark package ships (nothing is downloaded), into
``segments-jvm.jar`` beside this file; ``make install`` builds it and
`pipeline.session.local_session` puts it on Spark's class path. ``python -m
pipeline.jvm`` builds it by hand; the .deb builds it into the package.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = HERE / "src"
JAR = HERE / "segments-jvm.jar"
#: The ServiceLoader entry that makes ``format("segments-jvm")`` find the class.
SERVICE = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
PROVIDER = "io.segmentgateway.spark.SegmentsJvmSource"


class BuildError(RuntimeError):
    """The jar could not be built (no javac, no pyspark, a compile error)."""


def spark_jars() -> pathlib.Path:
    """The directory of jars the installed pyspark package ships."""
    try:
        import pyspark
    except ImportError as e:
        raise BuildError("pyspark is not installed (pip install '.[pipeline]')") from e
    return pathlib.Path(pyspark.__file__).resolve().parent / "jars"


def sources() -> list[pathlib.Path]:
    """The Java source files, sorted."""
    return sorted(SOURCES.rglob("*.java"))


def up_to_date() -> bool:
    """Whether the jar exists and is newer than every source file."""
    if not JAR.exists():
        return False
    built = JAR.stat().st_mtime
    return all(s.stat().st_mtime <= built for s in sources())


def jar_path() -> pathlib.Path | None:
    """The built jar, or None if it has not been built (``make install`` builds it)."""
    return JAR if JAR.exists() else None


def build(force: bool = False) -> pathlib.Path:
    """Compile the sources into `JAR` (unless it is up to date); the jar's path."""
    if not force and up_to_date():
        return JAR
    javac = shutil.which("javac")
    if javac is None:
        raise BuildError("javac not found: install a JDK (Debian: openjdk-17-jdk-headless)")
    classpath = os.path.join(str(spark_jars()), "*")
    with tempfile.TemporaryDirectory(prefix="segments-jvm-") as tmp:
        classes = pathlib.Path(tmp) / "classes"
        classes.mkdir()
        cmd = [javac, "--release", "17", "-Xlint:all,-path", "-Werror",
               "-cp", classpath, "-d", str(classes), *map(str, sources())]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"javac failed:\n{done.stdout}{done.stderr}")
        partial = JAR.with_suffix(".jar.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            jar.writestr(SERVICE, PROVIDER + "\n")
            for f in sorted(classes.rglob("*.class")):
                jar.write(f, f.relative_to(classes).as_posix())
        os.replace(partial, JAR)
    return JAR
