package io.segmentgateway.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.StringStartsWith;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Builds, plans and reads one scan: filters on segment (=, IN, starts with) and offset
 * (=, &lt;, &lt;=, &gt;, &gt;=) choose segments and byte ranges before anything is read, as
 * the Python source's pushFilters does; columns not asked for are not written. In a streaming
 * query it is the SegmentsStream's scan.
 */
final class SegmentsScan
    implements ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns, Scan,
        Batch {
  private final Options options;
  /** The options as given (the streaming ones are read by SegmentsStream). */
  private final CaseInsensitiveStringMap given;
  private Set<String> names;
  private final List<String> prefixes = new ArrayList<>();
  private Filter[] pushed = new Filter[0];
  private StructType required = SegmentsJvmSource.SCHEMA;

  SegmentsScan(Options options, CaseInsensitiveStringMap given) {
    this.options = options;
    this.given = given;
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    List<Filter> rest = new ArrayList<>();
    List<Filter> taken = new ArrayList<>();
    for (Filter f : filters) {
      if (take(f)) {
        taken.add(f);
      } else {
        rest.add(f);
      }
    }
    pushed = taken.toArray(new Filter[0]);
    return rest.toArray(new Filter[0]);
  }

  private boolean take(Filter f) {
    if (f instanceof EqualTo e && e.attribute().equals("segment") && e.value() instanceof String s) {
      narrow(Set.of(s));
      return true;
    }
    if (f instanceof In in && in.attribute().equals("segment")) {
      Set<String> values = new HashSet<>();
      for (Object v : in.values()) {
        if (!(v instanceof String s)) {
          return false;
        }
        values.add(s);
      }
      narrow(values);
      return true;
    }
    if (f instanceof StringStartsWith p && p.attribute().equals("segment")) {
      prefixes.add(p.value());
      return true;
    }
    if (f instanceof EqualTo e && e.attribute().equals("offset") && isLong(e.value())) {
      long v = ((Number) e.value()).longValue();
      options.lo = Math.max(options.lo, v);
      options.hi = Math.min(options.hi, v + 1);
      return true;
    }
    if (f instanceof GreaterThan g && g.attribute().equals("offset") && isLong(g.value())) {
      options.lo = Math.max(options.lo, ((Number) g.value()).longValue() + 1);
      return true;
    }
    if (f instanceof GreaterThanOrEqual g && g.attribute().equals("offset") && isLong(g.value())) {
      options.lo = Math.max(options.lo, ((Number) g.value()).longValue());
      return true;
    }
    if (f instanceof LessThan l && l.attribute().equals("offset") && isLong(l.value())) {
      options.hi = Math.min(options.hi, ((Number) l.value()).longValue());
      return true;
    }
    if (f instanceof LessThanOrEqual l && l.attribute().equals("offset") && isLong(l.value())) {
      options.hi = Math.min(options.hi, ((Number) l.value()).longValue() + 1);
      return true;
    }
    return false;
  }

  private static boolean isLong(Object v) {
    return v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte;
  }

  private void narrow(Set<String> values) {
    if (names == null) {
      names = new HashSet<>(values);
    } else {
      names.retainAll(values);
    }
  }

  @Override
  public Filter[] pushedFilters() {
    return pushed;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    required = requiredSchema;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return required;
  }

  @Override
  public String description() {
    return "segments-jvm " + options.path + " PushedFilters: " + java.util.Arrays.toString(pushed);
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    try {
      return new Planner(options, names, prefixes).parts().toArray(new InputPartition[0]);
    } catch (IOException e) {
      throw new UncheckedIOException("segments-jvm: listing " + options.path + ": " + e, e);
    }
  }

  /** readStream: the streaming source (Spark pushes no filters or columns into it). */
  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return new SegmentsStream(options, given);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new PartReaders(required);
  }
}
