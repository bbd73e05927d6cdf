package io.segmentgateway.spark;

import java.io.Serializable;
import java.util.Locale;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The source's options, parsed as pipeline/source.py parses them. */
final class Options implements Serializable {
  private static final long serialVersionUID = 1L;
  /** Spark's maxPartitionBytes, the Python source's DEFAULT_SPLIT. */
  static final long DEFAULT_SPLIT = 128L * 1024 * 1024;

  String path;
  /** "" means each segment's own (user.segment.codec), else framed. */
  String codec;
  long lo;
  long hi;
  boolean includeActive;
  long splitSize;

  static Options parse(CaseInsensitiveStringMap map) {
    Options o = new Options();
    o.path = map.getOrDefault("path", "");
    if (o.path.isEmpty()) {
      throw new IllegalArgumentException(
          "segments-jvm: give a path: spark.read.format(\"segments-jvm\").load(PATH)");
    }
    o.codec = map.getOrDefault("codec", "");
    if (!o.codec.isEmpty() && !o.codec.equals("framed") && !o.codec.equals("lines")) {
      throw new IllegalArgumentException(
          "segments-jvm: codec must be framed or lines, not '" + o.codec + "'");
    }
    o.lo = Long.parseLong(map.getOrDefault("startOffset", "0").trim());
    o.hi = Long.parseLong(map.getOrDefault("endOffset", Long.toString(Long.MAX_VALUE)).trim());
    o.includeActive = parseBool(map.getOrDefault("includeActive", "true"));
    o.splitSize = Math.max(1, parseSize(map.getOrDefault("splitSize", Long.toString(DEFAULT_SPLIT))));
    return o;
  }

  /** An option's truth: true, 1 or yes. */
  static boolean parseBool(String text) {
    String t = text.trim().toLowerCase(Locale.ROOT);
    return t.equals("true") || t.equals("1") || t.equals("yes");
  }

  /** Bytes from "134217728", "128m", "1g" (Spark's size strings), as parse_size. */
  static long parseSize(String text) {
    String t = text.trim().toLowerCase(Locale.ROOT);
    if (t.endsWith("b")) {
      t = t.substring(0, t.length() - 1);
    }
    if (t.endsWith("i")) {
      t = t.substring(0, t.length() - 1);
    }
    long unit = 1;
    if (!t.isEmpty()) {
      switch (t.charAt(t.length() - 1)) {
        case 'k': unit = 1L << 10; break;
        case 'm': unit = 1L << 20; break;
        case 'g': unit = 1L << 30; break;
        case 't': unit = 1L << 40; break;
        default: unit = 0;
      }
      if (unit != 0) {
        t = t.substring(0, t.length() - 1);
      } else {
        unit = 1;
      }
    }
    return (long) (Double.parseDouble(t) * unit);
  }
}
