package io.segmentgateway.spark;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * Where the driver cuts a segment's new bytes: at the last newline, after so many events, or
 * within so many bytes, always at an event boundary (pipeline/stream.py's _last_newline_end,
 * _walk_frames, _count_cut and _bytes_cut, rule for rule).
 */
final class Cuts {
  /** A lines scan looks back this much at first, doubling (parts.py SCAN_BYTES). */
  static final int SCAN_BYTES = 64 * 1024;
  /** Bytes read at a time when the driver counts or looks for events (stream.py _READ). */
  static final int READ = 4 * 1024 * 1024;
  /** Events without limit. */
  static final long ALL = 1L << 62;

  private Cuts() {}

  /** Up to n bytes of the file from pos into buf[0, n); fewer only at the file's end. */
  private static int readAt(FileChannel ch, byte[] buf, int n, long pos) throws IOException {
    ByteBuffer into = ByteBuffer.wrap(buf, 0, n);
    while (into.hasRemaining()) {
      int got = ch.read(into, pos + into.position());
      if (got < 0) {
        break;
      }
    }
    return into.position();
  }

  /** Just past the last newline in [lo, hi) of file, or lo if there is none. */
  static long lastNewlineEnd(Path file, long lo, long hi) throws IOException {
    try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
      long pos = hi;
      int step = SCAN_BYTES;
      byte[] buf = new byte[READ];
      while (pos > lo) {
        long a = Math.max(lo, pos - step);
        int got = readAt(ch, buf, (int) (pos - a), a);
        for (int k = got - 1; k >= 0; k--) {
          if (buf[k] == '\n') {
            return a + k + 1;
          }
        }
        pos = a;
        step = Math.min(2 * step, READ);
      }
    }
    return lo;
  }

  /** The 4-byte lengths of frames, read through one buffer (a frame's header is 4 bytes). */
  static final class Frames implements Closeable {
    private final FileChannel ch;
    private final byte[] buf = new byte[READ];
    private long bufStart;
    private int bufLen;

    Frames(Path file) throws IOException {
      ch = FileChannel.open(file, StandardOpenOption.READ);
    }

    /** The big-endian length at pos, or -1 if the file ends before its 4 bytes. */
    long lengthAt(long pos) throws IOException {
      if (pos < bufStart || pos + 4 > bufStart + bufLen) {
        bufStart = pos;
        bufLen = readAt(ch, buf, buf.length, pos);
      }
      if (pos + 4 > bufStart + bufLen) {
        return -1;
      }
      int i = (int) (pos - bufStart);
      return ((buf[i] & 0xffL) << 24) | ((buf[i + 1] & 0xffL) << 16)
          | ((buf[i + 2] & 0xffL) << 8) | (buf[i + 3] & 0xffL);
    }

    @Override
    public void close() throws IOException {
      ch.close();
    }
  }

  /**
   * {where frames read from pos end, how many}: up to events of them, all ending at or before
   * hi.
   */
  static long[] walkFrames(Frames f, long pos, long hi, long events) throws IOException {
    long n = 0;
    while (n < events) {
      long length = f.lengthAt(pos);
      if (length < 0) {
        break;
      }
      long end = pos + 4 + length;
      if (end > hi) {
        break;
      }
      pos = end;
      n++;
    }
    return new long[] {pos, n};
  }

  /** {where the events-th event from lo ends, or hi; events up to there}. */
  static long[] countCut(Path file, String codec, long lo, long hi, long events)
      throws IOException {
    long n = 0;
    if (codec.equals("lines")) {
      try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
        byte[] buf = new byte[READ];
        long pos = lo;
        while (pos < hi) {
          int got = readAt(ch, buf, (int) Math.min(READ, hi - pos), pos);
          if (got == 0) {
            break;
          }
          for (int k = 0; k < got; k++) {
            if (buf[k] == '\n' && ++n == events) {
              return new long[] {pos + k + 1, n};
            }
          }
          pos += got;
        }
        return new long[] {Math.min(pos, hi), n};
      }
    }
    // The last frame may end past hi: an event at least, whatever the limit.
    try (Frames f = new Frames(file)) {
      long[] walked = walkFrames(f, lo, hi, events);
      long pos = walked[0];
      n = walked[1];
      if (n < events && pos < hi) {
        long[] last = walkFrames(f, pos, ALL, 1);
        pos = last[0];
        n += last[1];
      }
      return new long[] {Math.min(pos, hi), n};
    }
  }

  /** The furthest event boundary in (lo, lo + budget], else the first past it. */
  static long bytesCut(Path file, String codec, long lo, long hi, long budget)
      throws IOException {
    if (budget >= hi - lo) {
      return hi;
    }
    long cap = lo + budget;
    if (codec.equals("lines")) {
      long cut = lastNewlineEnd(file, lo, cap);
      return cut > lo ? cut : countCut(file, codec, lo, hi, 1)[0];
    }
    // From the last indexed boundary below the cap (about a MiB apart), walk the frames up to it.
    long pos = lo;
    for (long b : Planner.readEventIndex(file, 0)) {
      if (lo < b && b <= cap && b > pos) {
        pos = b;
      }
    }
    try (Frames f = new Frames(file)) {
      pos = walkFrames(f, pos, cap, ALL)[0];
    }
    return pos > lo ? pos : countCut(file, codec, lo, hi, 1)[0];
  }
}
