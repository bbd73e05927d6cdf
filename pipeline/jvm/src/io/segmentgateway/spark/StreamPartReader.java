package io.segmentgateway.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one part of a streaming batch on an executor (pipeline/stream.py's _read_part): the
 * events of the part; nothing more once its segment is proven deleted.
 *
 * <p>Until it hands over its first row, a part whose mount cannot be read (a gateway
 * restarting, this node's view not showing the segment yet) is tried again for up to
 * MOUNT_CATCH_UP_MS. Any error after that, or one that lasts, fails the task: Spark runs it
 * again, or the batch fails and the query started again from its checkpoint reads it again. A
 * task never ends early as if the data ended there, but for a segment the mount shows deleted
 * (its name holds another segment, or its directory a later segment of the same node): what
 * was read of it is returned.
 */
final class StreamPartReader implements PartitionReader<InternalRow> {
  private static final Logger LOG = LoggerFactory.getLogger(StreamPartReader.class);
  /** How long a task waits for its node's mount to show what the driver saw (ms). */
  static final long MOUNT_CATCH_UP_MS = 60_000L;
  private static final long POLL_MS = 50;

  private final PartReaders columns;
  private final Part part;
  /** MOUNT_CATCH_UP_MS, or the executor's system property segmentgateway.mountCatchUpMs. */
  private final long catchUpMs = Long.getLong("segmentgateway.mountCatchUpMs", MOUNT_CATCH_UP_MS);
  private final long deadline;
  private PartReaders.Reader inner;
  private boolean handed;
  private boolean waited;
  private boolean finished;

  StreamPartReader(PartReaders columns, Part part) {
    this.columns = columns;
    this.part = part;
    this.deadline = System.nanoTime() + catchUpMs * 1_000_000L;
  }

  @Override
  public boolean next() throws IOException {
    while (!finished) {
      try {
        if (inner == null) {
          Part p = prepare();
          if (p == null) {
            finished = true;
            break;
          }
          inner = columns.open(p);
        }
        if (inner.next()) {
          handed = true;
          return true;
        }
        finished = true;
      } catch (IOException | UncheckedIOException thrown) {
        IOException e = Mount.io(thrown);
        closeInner();
        int errno = Mount.errno(e);
        if (Mount.notFound(errno) && deleted(part)) {
          LOG.warn("segments-jvm: {} was deleted while a task read it; what was not read of it "
              + "is lost", part.segment);
          finished = true;
          break;
        }
        if (handed || Mount.permanent(errno) || System.nanoTime() > deadline) {
          throw new IOException(part.segment + " [" + part.start + ", " + part.end + "): "
              + e.getMessage() + "; the mount does not show it deleted, so the task fails (to be"
              + " run again)", e);
        }
        if (!waited) {
          LOG.warn("segments-jvm: a task cannot read {} yet: {}; trying again for up to {} s",
              part.segment, e.getMessage(), catchUpMs / 1000.0);
          waited = true;
        }
        SegmentsStream.sleep(SegmentsStream.RETRY_MS);
      }
    }
    return false;
  }

  @Override
  public InternalRow get() {
    return inner.get();
  }

  @Override
  public void close() throws IOException {
    closeInner();
  }

  private void closeInner() {
    if (inner != null) {
      try {
        inner.close();
      } catch (IOException ignored) {
        // the part is read again, or the task fails with the error that got here
      }
      inner = null;
    }
  }

  /** The mount point a part's file is under (its name is the path below it). */
  private static Path root(Part p) {
    String r = p.file.substring(0, p.file.length() - p.segment.length());
    while (r.length() > 1 && r.endsWith("/")) {
      r = r.substring(0, r.length() - 1);
    }
    return Paths.get(r.isEmpty() ? "/" : r);
  }

  /**
   * The part to read now (stream.py _read_part_once): null if nothing of it is left, or the
   * part from the first event left if the segment was truncated since the batch was planned.
   */
  private Part prepare() throws IOException {
    Path file = Paths.get(part.file);
    if (part.created != 0 && Mount.number(file, "segment.created_ms") != part.created) {
      // Deleted and created again: its bytes are another segment's.
      throw Mount.stale(part.file, part.segment + " was created again");
    }
    waitForEnd(file, part.lines ? part.length : part.end);
    long startOffset = Mount.number(file, "segment.start_offset");
    if (startOffset > part.start) {
      // Truncated since the batch was planned: the bytes below read as zeros. Start at the
      // first event at or after the start offset.
      Path trimmed = root(part).resolve(SegmentsStream.TRIMMED_DIR).resolve(part.segment);
      long first = Mount.number(trimmed, "segment.view_offset");
      return first >= part.end ? null : part.startingAt(first);
    }
    return part;
  }

  /**
   * Wait until this node's mount shows the segment up to end: the driver planned the batch from
   * its own node's mount; on another node the same segment may show less for a moment.
   */
  private void waitForEnd(Path file, long end) throws IOException {
    long until = System.nanoTime() + catchUpMs * 1_000_000L;
    long shown;
    while ((shown = Mount.number(file, "segment.event_end")) < end) {
      if (System.nanoTime() > until) {
        throw new IOException(part.segment + ": this node's mount shows " + shown + " bytes after "
            + catchUpMs / 1000.0 + " s; the batch reads up to " + end);
      }
      SegmentsStream.sleep(POLL_MS);
    }
  }

  /**
   * Whether the mount proves a part's segment deleted (stream.py _deleted, SegmentsStream.gone):
   * a live gateway mount shows its name holding another segment, or a segment of the same node
   * created after it in its directory. A part whose segment's creation is not known has no
   * proof.
   */
  static boolean deleted(Part p) {
    if (p.created == 0) {
      return false;
    }
    try {
      Mount.check(root(p).toString());
      Path file = Paths.get(p.file);
      try {
        return Mount.number(file, "segment.created_ms") != p.created;
      } catch (IOException e) {
        if (!Mount.notFound(Mount.errno(e))) {
          return false;
        }
      }
      List<Path> entries = new ArrayList<>();
      try (DirectoryStream<Path> listing = Files.newDirectoryStream(file.getParent())) {
        for (Path entry : listing) {
          entries.add(entry);
        }
      }
      entries.sort(Collections.reverseOrder()); // a stream's newest first
      for (Path entry : entries) {
        String name = entry.getFileName().toString();
        if (name.startsWith(".") || name.startsWith("_")) {
          continue;
        }
        try {
          if (Mount.number(entry, "segment.created_ms") > p.created
              && (p.node.isEmpty() || Mount.xattr(entry, "segment.node").equals(p.node))) {
            return true;
          }
        } catch (IOException e) {
          int errno = Mount.errno(e);
          if (!Mount.notFound(errno) && errno != Mount.ENODATA) {
            return false; // a directory, or a mount going away
          }
        }
      }
    } catch (IOException | RuntimeException e) {
      return false;
    }
    return false;
  }
}
