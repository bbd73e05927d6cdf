package io.segmentgateway.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Bytes of one segment file, as pipeline/parts.py's SegmentPart (framed) and LinesPart.
 *
 * <p>Framed: [start, end) are event boundaries; events starting in [lo, hi) are returned.
 * Lines: the lines starting in [start, end), read on through their newline but never past
 * {@code length} (the length when listed); {@code head}: a line is known to start at start;
 * {@code complete}: length is the sealed segment's final length, so a last line without a
 * newline is whole.
 *
 * <p>A streaming part (SegmentsStream) also carries the segment's creation time and owner
 * when it was planned, to tell its deletion from a mount that does not show it for a moment,
 * and is read by StreamPartReader (retries, deletion proven, truncation since planning).
 */
final class Part implements InputPartition {
  private static final long serialVersionUID = 1L;

  final boolean lines;
  final String file;
  final String segment;
  final long start;
  final long end;
  final long lo;
  final long hi;
  final long length;
  final boolean head;
  final boolean sealed;
  final boolean complete;
  /** Streaming: the segment's creation time (Unix ms) when planned; 0: not known. */
  long created;
  /** Streaming: the node that owns it ("" if not known). */
  String node = "";
  /** Planned by the streaming source: read by StreamPartReader. */
  boolean stream;

  private Part(boolean lines, String file, String segment, long start, long end, long lo,
      long hi, long length, boolean head, boolean sealed, boolean complete) {
    this.lines = lines;
    this.file = file;
    this.segment = segment;
    this.start = start;
    this.end = end;
    this.lo = lo;
    this.hi = hi;
    this.length = length;
    this.head = head;
    this.sealed = sealed;
    this.complete = complete;
  }

  static Part framed(String file, String segment, long start, long end, long lo, long hi,
      boolean sealed) {
    return new Part(false, file, segment, start, end, lo, hi, end, false, sealed, false);
  }

  static Part lines(String file, String segment, long start, long end, long length,
      boolean head, boolean sealed, boolean complete) {
    return new Part(true, file, segment, start, end, start, end, length, head, sealed, complete);
  }

  /**
   * This part from the segment's first event {@code first} on (truncated since it was
   * planned: below the start offset are zeros): framed events from there, or lines with one
   * known to start there.
   */
  Part startingAt(long first) {
    Part q = lines
        ? new Part(true, file, segment, first, end, first, end, length, true, sealed, complete)
        : new Part(false, file, segment, first, end, Math.max(lo, first), hi, end, false, sealed,
            false);
    q.created = created;
    q.node = node;
    q.stream = stream;
    return q;
  }
}
