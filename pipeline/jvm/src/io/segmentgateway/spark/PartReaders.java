package io.segmentgateway.spark;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Reads parts on the executors: framed events (4-byte big-endian length, then the event) and
 * lines (Hadoop's rule, cut at the listed length), as pipeline/parts.py's framed_events and
 * line_events, into rows written in place (Spark's own text reader writes its rows the same way).
 */
final class PartReaders implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;
  /** Bytes read from the mount at once: the gateway's prefetcher sees a sequential reader. */
  static final int READ_BUFFER = 1024 * 1024;

  /** Where each column goes in the rows asked for (-1: not asked for). */
  private final int segmentAt;
  private final int offsetAt;
  private final int eventAt;
  private final int sealedAt;
  private final int width;

  PartReaders(StructType required) {
    segmentAt = find(required, "segment");
    offsetAt = find(required, "offset");
    eventAt = find(required, "event");
    sealedAt = find(required, "sealed");
    width = required.size();
  }

  private static int find(StructType schema, String name) {
    String[] names = schema.fieldNames();
    for (int i = 0; i < names.length; i++) {
      if (names[i].equals(name)) {
        return i;
      }
    }
    return -1;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    Part p = (Part) partition;
    if (p.stream) {
      return new StreamPartReader(this, p);
    }
    try {
      return open(p);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(p.segment + ": " + e, e);
    }
  }

  /** A reader of the part's events, its file opened (and, for lines, its first line found). */
  Reader open(Part p) throws IOException {
    return p.lines ? new LinesReader(this, p) : new FramedReader(this, p);
  }

  /** The bytes of one part through one buffer, never past a limit. */
  abstract static class Reader implements PartitionReader<InternalRow> {
    final PartReaders columns;
    final Part part;
    final FileChannel channel;
    final UnsafeRowWriter writer;
    final UTF8String segment;
    byte[] buf = new byte[READ_BUFFER];
    /** buf[pos, lim) holds the file's bytes from filePos - (lim - pos). */
    int pos;
    int lim;
    /** The file offset of buf[lim]. */
    long filePos;

    Reader(PartReaders columns, Part part, long from) throws IOException {
      this.columns = columns;
      this.part = part;
      this.channel = FileChannel.open(Paths.get(part.file), StandardOpenOption.READ);
      this.writer = new UnsafeRowWriter(columns.width, 256);
      this.segment = UTF8String.fromString(part.segment);
      channel.position(from);
      filePos = from;
    }

    /** The file offset of buf[pos]. */
    final long offsetAt(int i) {
      return filePos - (lim - i);
    }

    /**
     * Reads more bytes after buf[lim], up to the file offset limit; keeps buf[keep, lim) (moved
     * to the front), growing the buffer if it is all kept. False at the limit or the file's end.
     */
    final boolean fill(int keep, long limit) throws IOException {
      if (filePos >= limit) {
        return false;
      }
      int kept = lim - keep;
      if (keep > 0) {
        System.arraycopy(buf, keep, buf, 0, kept);
        pos -= keep;
      } else if (kept == buf.length) {
        byte[] bigger = new byte[buf.length * 2];
        System.arraycopy(buf, 0, bigger, 0, kept);
        buf = bigger;
      }
      lim = kept;
      int want = (int) Math.min(buf.length - lim, limit - filePos);
      ByteBuffer into = ByteBuffer.wrap(buf, lim, want);
      int got = channel.read(into);
      if (got <= 0) {
        return false;
      }
      lim += got;
      filePos += got;
      return true;
    }

    final InternalRow row(long offset, byte[] data, int from, int n) {
      writer.reset();
      writer.zeroOutNullBytes();
      if (columns.segmentAt >= 0) {
        writer.write(columns.segmentAt, segment);
      }
      if (columns.offsetAt >= 0) {
        writer.write(columns.offsetAt, offset);
      }
      if (columns.eventAt >= 0) {
        writer.write(columns.eventAt, data, from, n);
      }
      if (columns.sealedAt >= 0) {
        writer.write(columns.sealedAt, part.sealed);
      }
      return writer.getRow();
    }

    @Override
    public void close() throws IOException {
      channel.close();
    }
  }

  /** Length-prefixed events starting in [lo, hi) of a part whose bounds are event boundaries. */
  static final class FramedReader extends Reader {
    private long offset;
    private InternalRow current;

    FramedReader(PartReaders columns, Part part) throws IOException {
      super(columns, part, part.start);
      offset = part.start;
    }

    /** At least n bytes at buf[pos]; EOFException naming the event if the file ends first. */
    private void need(int n, String what) throws IOException {
      while (lim - pos < n) {
        if (!fill(pos, part.end)) {
          throw new EOFException(part.segment + ": event at " + offset + " cut short (" + what + ")");
        }
      }
    }

    @Override
    public boolean next() throws IOException {
      while (offset < part.end && offset < part.hi) {
        need(4, "length prefix");
        int n = ((buf[pos] & 0xff) << 24) | ((buf[pos + 1] & 0xff) << 16)
            | ((buf[pos + 2] & 0xff) << 8) | (buf[pos + 3] & 0xff);
        if (n < 0) {
          throw new IOException(part.segment + ": event at " + offset + " has a length over 2 GiB");
        }
        pos += 4;
        need(n, (lim - pos) + " of " + n);
        long at = offset;
        int from = pos;
        pos += n;
        offset += 4L + n;
        if (at >= part.lo) {
          current = row(at, buf, from, n);
          return true;
        }
      }
      return false;
    }

    @Override
    public InternalRow get() {
      return current;
    }
  }

  /** The lines starting in [start, end), each read through its newline, never past length. */
  static final class LinesReader extends Reader {
    /** The file offset where the next line starts (-1: no more lines). */
    private long lineStart;
    private InternalRow current;

    LinesReader(PartReaders columns, Part part) throws IOException {
      super(columns, part, part.head ? part.start : part.start - 1);
      try {
        lineStart = part.head ? part.start : firstLine();
      } catch (IOException | RuntimeException e) {
        channel.close(); // a task that tries again opens it again
        throw e;
      }
    }

    /** Hadoop's rule: the first line starts after the first newline at or after start - 1. */
    private long firstLine() throws IOException {
      // A newline at end - 1 or later starts no line of ours.
      long limit = part.end - 1;
      while (true) {
        for (int i = pos; i < lim; i++) {
          if (buf[i] == '\n') {
            long at = offsetAt(i);
            if (at >= limit) {
              return -1;
            }
            pos = i + 1;
            return at + 1;
          }
        }
        pos = lim;
        if (!fill(pos, limit)) {
          if (filePos < limit) {
            throw new EOFException(part.segment + ": ends at " + filePos + ", before " + part.length);
          }
          return -1;
        }
      }
    }

    @Override
    public boolean next() throws IOException {
      if (lineStart < 0 || lineStart >= part.end) {
        return false;
      }
      // buf[pos, lim) holds the file's bytes from lineStart on.
      int scan = pos;
      while (true) {
        for (int i = scan; i < lim; i++) {
          if (buf[i] == '\n') {
            current = row(lineStart, buf, pos, i - pos);
            lineStart += i - pos + 1;
            pos = i + 1;
            return true;
          }
        }
        int scanned = lim - pos;
        if (!fill(pos, part.length)) {
          if (filePos < part.length) {
            throw new EOFException(part.segment + ": ends at " + filePos + ", before " + part.length);
          }
          // At the listed length: a last line without a newline is whole only
          // once the segment is sealed at this length; else it may be half written.
          long at = lineStart;
          lineStart = -1;
          if (lim > pos && part.complete) {
            current = row(at, buf, pos, lim - pos);
            pos = lim;
            return true;
          }
          return false;
        }
        scan = pos + scanned;
      }
    }

    @Override
    public InternalRow get() {
      return current;
    }
  }
}
