package io.segmentgateway.spark;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("segments-jvm")}: the rows of the Python {@code segments} source
 * (pipeline/source.py), planned and read in the JVM.
 *
 * <p>Same columns (segment, offset, event, sealed), same options (codec, startOffset,
 * endOffset, includeActive, splitSize), the same parts by the same rules, filter pushdown on
 * segment and offset. {@code spark.readStream.format("segments-jvm")} is the streaming
 * {@code segments} source (pipeline/stream.py) in the JVM: SegmentsStream, same options and
 * offsets. A Python source hands every row to the JVM through Arrow, which alone costs as much
 * as Spark's own text reader; here the rows are written where Spark's own readers write theirs.
 */
public final class SegmentsJvmSource implements TableProvider, DataSourceRegister {
  /** The columns, as the Python source's "segment string, offset long, event binary, sealed boolean". */
  public static final StructType SCHEMA =
      new StructType()
          .add("segment", DataTypes.StringType)
          .add("offset", DataTypes.LongType)
          .add("event", DataTypes.BinaryType)
          .add("sealed", DataTypes.BooleanType);

  @Override
  public String shortName() {
    return "segments-jvm";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new SegmentsTable();
  }
}
