package io.segmentgateway.spark;

import java.util.EnumSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The segments under one mounted path, read in batch or as a stream. */
final class SegmentsTable implements SupportsRead {
  @Override
  public String name() {
    return "segments-jvm";
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return SegmentsJvmSource.SCHEMA;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new SegmentsScan(Options.parse(options), options);
  }
}
