package io.segmentgateway.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.readStream.format("segments-jvm")}: pipeline/stream.py's streaming source, rule
 * for rule, planned on the driver in the JVM and read by PartReaders (rows written in place).
 *
 * <p>The same options (codec, includeActive, splitSize, startingOffsets, minPartitions,
 * maxBytesPerTrigger / maxEventsPerTrigger, mountTimeout), the same offsets as the same JSON
 * text (StreamOffset), the same listing through the mount's xattrs, offsets at event
 * boundaries, "done" for sealed segments read to their end, truncation from the .trimmed
 * view's view_offset, deletion only when proven (gone), batches planned from a live gateway
 * mount only (waiting up to mountTimeout), and tasks that try a part again for a while and
 * end early only for a segment proven deleted (StreamPartReader). stream.py's module
 * docstring states these rules; docs/PIPELINE.md explains them.
 */
final class SegmentsStream implements MicroBatchStream, SupportsTriggerAvailableNow {
  private static final Logger LOG = LoggerFactory.getLogger(SegmentsStream.class);
  /** The smallest part a batch is cut into for parallelism (minPartitions). */
  static final long MIN_PART = 4L * 1024 * 1024;
  /** How long the driver waits for a mount that cannot be read (option mountTimeout). */
  static final double MOUNT_TIMEOUT = 120.0;
  /** How often a mount that cannot be read is tried again (ms). */
  static final long RETRY_MS = 500;
  /** The mount's view that starts each segment at its first event (segment_names TRIMMED_DIR). */
  static final String TRIMMED_DIR = ".trimmed";
  private static final Pattern DURATION =
      Pattern.compile("^\\s*([0-9]+(?:\\.[0-9]+)?)\\s*([A-Za-z]*)\\s*$");

  /** One segment as the driver saw it: name, creation, where it can be read (stream.py Listed). */
  static final class Listed {
    final String name;
    final Path file;
    final long created;
    final boolean sealed;
    final long startOffset;
    /** The end of its last complete event (for the codec it is read with). */
    long end;
    final String codec;
    /** The node that owns it (user.segment.node; "" if not known). */
    final String node;

    Listed(String name, Path file, long created, boolean sealed, long startOffset, long end,
        String codec, String node) {
      this.name = name;
      this.file = file;
      this.created = created;
      this.sealed = sealed;
      this.startOffset = startOffset;
      this.end = end;
      this.codec = codec;
      this.node = node;
    }
  }

  /** A "done" entry: creation time and node. */
  record Done(long created, String node) {
    /** [created, node], or a bare creation time as older offsets have it. */
    static Done of(JsonNode v) {
      if (v.isArray()) {
        return new Done(v.get(0).asLong(), v.size() > 1 ? v.get(1).asText() : "");
      }
      return new Done(v.asLong(), "");
    }

    ArrayNode json() {
      return StreamOffset.NODES.arrayNode().add(created).add(node);
    }
  }

  /** An attempt that may fail with an I/O error (retried while the mount cannot be read). */
  interface Attempt<T> {
    T run() throws IOException;
  }

  private final Options options;
  private final Path path;
  private final boolean latestStart;
  private final int minPartitions;
  private final long maxBytes;
  private final long maxEvents;
  private final double mountTimeout;
  /** The gateway mount holding the path (names are relative to it); found when first needed. */
  private String root;
  /** Trigger.AvailableNow: the segments and ends there were at the start (name: created, end). */
  private Map<String, long[]> target;
  /** Segments kept although the mount does not show them (warned once): name + created. */
  private final Set<String> missing = new HashSet<>();

  SegmentsStream(Options options, CaseInsensitiveStringMap map) {
    this.options = options;
    this.path = Paths.get(options.path).toAbsolutePath().normalize();
    String starting = map.getOrDefault("startingOffsets", "earliest");
    if (!starting.equals("earliest") && !starting.equals("latest")) {
      throw new IllegalArgumentException(
          "segments-jvm: startingOffsets must be earliest or latest, not '" + starting + "'");
    }
    latestStart = starting.equals("latest");
    String cores = Integer.toString(Runtime.getRuntime().availableProcessors());
    minPartitions = Math.max(1, Integer.parseInt(map.getOrDefault("minPartitions", cores).trim()));
    maxBytes = map.containsKey("maxBytesPerTrigger")
        ? Options.parseSize(map.get("maxBytesPerTrigger")) : 0;
    maxEvents = map.containsKey("maxEventsPerTrigger")
        ? Long.parseLong(map.get("maxEventsPerTrigger").trim()) : 0;
    if (maxBytes != 0 && maxEvents != 0) {
      throw new IllegalArgumentException(
          "segments-jvm: give maxBytesPerTrigger or maxEventsPerTrigger, not both");
    }
    if (maxBytes < 0 || maxEvents < 0) {
      throw new IllegalArgumentException("segments-jvm: a per-trigger limit must be positive");
    }
    mountTimeout = map.containsKey("mountTimeout")
        ? parseDuration(map.get("mountTimeout")) : MOUNT_TIMEOUT;
    try {
      root = Mount.gatewayMount(path);
    } catch (IOException e) {
      root = null; // found when first needed
    }
  }

  /** Seconds from "120", "2ms", "10s", "1.5min" (gateway.config's parse_duration). */
  static double parseDuration(String text) {
    Matcher m = DURATION.matcher(text);
    Map<String, Double> units = Map.of("", 1.0, "s", 1.0, "ms", 1e-3, "us", 1e-6, "min", 60.0,
        "h", 3600.0, "d", 86400.0);
    Double unit = m.matches() ? units.get(m.group(2).toLowerCase(Locale.ROOT)) : null;
    if (unit == null) {
      throw new IllegalArgumentException("segments-jvm: cannot read '" + text
          + "' as a duration (examples: 0.5, '2ms', '10s')");
    }
    return Double.parseDouble(m.group(1)) * unit;
  }

  /** The mount point of the gateway mount that holds the path. */
  private String root() {
    if (root == null) {
      root = retrying("find the mount", () -> {
        String found = Mount.gatewayMount(path);
        if (found == null) {
          throw new Mount.Unavailable("no segment-gateway mount holds " + path);
        }
        return found;
      });
    }
    return root;
  }

  /**
   * attempt(), again while it fails with an I/O error, for up to mountTimeout (stream.py
   * _retrying). What was read through a mount that cannot be read is never planned from; after
   * the timeout the batch fails, and nothing was taken for deleted.
   */
  private <T> T retrying(String what, Attempt<T> attempt) {
    long deadline = System.nanoTime() + (long) (mountTimeout * 1e9);
    boolean warned = false;
    while (true) {
      try {
        return attempt.run();
      } catch (IOException | UncheckedIOException thrown) {
        IOException e = Mount.io(thrown);
        if (Mount.permanent(Mount.errno(e)) || System.nanoTime() >= deadline) {
          throw new UncheckedIOException(new Mount.Unavailable("segments-jvm: cannot " + what
              + " under " + path + " (waited " + seconds(mountTimeout) + " s): " + e.getMessage()
              + "; nothing was taken for deleted, so the query started again goes on where it"
              + " was", e));
        }
        if (!warned) {
          LOG.warn("segments-jvm: cannot {} under {}: {}; waiting up to {} s for the mount",
              what, path, e.getMessage(), seconds(mountTimeout));
          warned = true;
        }
        sleep(RETRY_MS);
      }
    }
  }

  static String seconds(double s) {
    return s == Math.rint(s) ? Long.toString((long) s) : Double.toString(s);
  }

  static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("segments-jvm: interrupted", e);
    }
  }

  // -- listing ---------------------------------------------------------------------------

  private String codecOf(String declared) {
    if (!options.codec.isEmpty()) {
      return options.codec;
    }
    return declared.equals("lines") || declared.equals("framed") ? declared : "framed";
  }

  /**
   * Every segment under the path now, in name order (stream.py list). Segments in done are
   * only checked for being the same segment. Active segments are listed even without
   * includeActive (they are evidence of what was deleted). Only a live gateway mount is listed,
   * the same one from start to end (Mount.Unavailable otherwise).
   */
  List<Listed> list(Map<String, Done> done) throws IOException {
    String top = root();
    Path rootPath = Paths.get(top);
    String mount = Mount.check(top);
    List<Listed> found = new ArrayList<>();
    for (Path file : Planner.listSegmentFiles(path)) {
      String name = rootPath.relativize(file).toString();
      boolean sealed;
      String declared;
      long end;
      long created;
      long startOffset;
      String node;
      try {
        Done d = done.get(name);
        if (d != null) {
          created = Mount.number(file, "segment.created_ms");
          if (created == d.created()) {
            found.add(new Listed(name, file, created, true, 0, 0, "", d.node()));
            continue;
          }
        }
        // Sealed before the end: a segment seen sealed has its final end.
        sealed = "1".equals(Mount.xattr(file, "segment.sealed"));
        declared = Mount.xattr(file, "segment.codec");
        end = Mount.number(file, "segment.event_end");
        created = Mount.number(file, "segment.created_ms");
        startOffset = Mount.number(file, "segment.start_offset");
        node = Mount.xattr(file, "segment.node");
      } catch (IOException e) {
        if (Mount.notFound(Mount.errno(e))) {
          continue; // deleted since the listing
        }
        throw e;
      }
      String codec = codecOf(declared);
      if (codec.equals("lines") && !declared.equals("lines") && !sealed && options.includeActive) {
        // The gateway does not know where this segment's lines end.
        end = Cuts.lastNewlineEnd(file, startOffset, end);
      }
      found.add(new Listed(name, file, created, sealed, startOffset, end, codec, node));
    }
    if (!Mount.check(top).equals(mount)) {
      throw new Mount.Unavailable("the mount at " + top + " changed");
    }
    return found;
  }

  private List<Listed> listing() {
    return retrying("list the segments", () -> list(Map.of()));
  }

  /** The listed segments this query reads (active ones only with includeActive). */
  private List<Listed> readable(List<Listed> listed) {
    if (options.includeActive) {
      return listed;
    }
    List<Listed> out = new ArrayList<>();
    for (Listed s : listed) {
      if (s.sealed) {
        out.add(s);
      }
    }
    return out;
  }

  /** Where reading a segment starts: its first event at or after the start offset. */
  private long first(Listed seg) throws IOException {
    if (seg.startOffset == 0) {
      return 0;
    }
    return Mount.number(Paths.get(root(), TRIMMED_DIR).resolve(seg.name), "segment.view_offset");
  }

  private static String dirname(String name) {
    int slash = name.lastIndexOf('/');
    return slash < 0 ? "" : name.substring(0, slash);
  }

  /**
   * Whether the listing proves that segment name (created, node) is deleted (stream.py _gone):
   * its name now holds another segment, or its directory shows a segment of the same node
   * created after it. A mount that lists nothing proves nothing.
   */
  static boolean gone(String name, long created, String node, Map<String, Listed> listing,
      Map<String, List<Listed>> byDir) {
    Listed now = listing.get(name);
    if (now != null) {
      return now.created != created;
    }
    for (Listed s : byDir.getOrDefault(dirname(name), List.of())) {
      if (s.created > created && (node.isEmpty() || s.node.isEmpty() || s.node.equals(node))) {
        return true;
      }
    }
    return false;
  }

  // -- offsets ---------------------------------------------------------------------------

  private static ObjectNode entry(Listed seg, long from, long at) {
    ObjectNode e = StreamOffset.NODES.objectNode();
    e.put("c", seg.created).put("from", from).put("at", at).put("k", seg.codec).put("n", seg.node);
    return e;
  }

  /** Earliest: nothing read yet; latest: every segment there is, read to its end. */
  @Override
  public Offset initialOffset() {
    ObjectNode segments = StreamOffset.NODES.objectNode();
    ObjectNode done = StreamOffset.NODES.objectNode();
    if (latestStart) {
      for (Listed seg : readable(listing())) {
        if (seg.sealed) {
          done.set(seg.name, new Done(seg.created, seg.node).json());
        } else {
          segments.set(seg.name, entry(seg, seg.end, seg.end));
        }
      }
    }
    return StreamOffset.of(segments, done);
  }

  /** Note what there is now: no batch goes past it. */
  @Override
  public void prepareForTriggerAvailableNow() {
    Map<String, long[]> now = new HashMap<>();
    for (Listed seg : readable(listing())) {
      now.put(seg.name, new long[] {seg.created, seg.end});
    }
    target = now;
  }

  /** maxBytesPerTrigger / maxEventsPerTrigger, else everything. */
  @Override
  public ReadLimit getDefaultReadLimit() {
    if (maxBytes != 0) {
      return ReadLimit.maxBytes(maxBytes);
    }
    if (maxEvents != 0) {
      return ReadLimit.maxRows(maxEvents);
    }
    return ReadLimit.allAvailable();
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException(
        "segments-jvm: latestOffset(Offset, ReadLimit) is to be called instead");
  }

  /**
   * The next batch's end: every segment advanced to its last event (within the limit). Planned
   * from a live mount only (waiting up to mountTimeout while there is none); a segment the
   * mount no longer shows leaves the offset only when its deletion is proven.
   */
  @Override
  public Offset latestOffset(Offset start, ReadLimit limit) {
    StreamOffset from = StreamOffset.of(start);
    StreamOffset next = retrying("plan the next batch", () -> latest(from, limit));
    return next == null ? start : next;
  }

  /** stream.py _latest; null when nothing moved (Spark then runs no batch). */
  private StreamOffset latest(StreamOffset start, ReadLimit limit) throws IOException {
    ObjectNode was = start.segments();
    Map<String, Done> doneBefore = new LinkedHashMap<>();
    for (Map.Entry<String, JsonNode> e : start.done().properties()) {
      doneBefore.put(e.getKey(), Done.of(e.getValue()));
    }
    List<Listed> everything = list(doneBefore);
    Map<String, Listed> listing = new HashMap<>();
    Map<String, List<Listed>> byDir = new HashMap<>();
    for (Listed seg : everything) {
      listing.put(seg.name, seg);
      byDir.computeIfAbsent(dirname(seg.name), k -> new ArrayList<>()).add(seg);
    }
    List<Listed> listed = readable(everything);
    if (target != null) {
      List<Listed> within = new ArrayList<>();
      for (Listed s : listed) {
        long[] t = target.get(s.name);
        if (t != null && t[0] == s.created) {
          if (s.end != 0) {
            s.end = Math.min(s.end, t[1]);
          }
          within.add(s);
        }
      }
      listed = within;
    }
    ObjectNode segments = StreamOffset.NODES.objectNode();
    ObjectNode done = StreamOffset.NODES.objectNode();
    boolean bytesLimit = limit instanceof ReadMaxBytes;
    boolean limited = bytesLimit || limit instanceof ReadMaxRows;
    long budget = bytesLimit ? ((ReadMaxBytes) limit).maxBytes()
        : limit instanceof ReadMaxRows r ? r.maxRows() : 0;
    boolean moved = false;
    for (Map.Entry<String, Done> e : doneBefore.entrySet()) {
      String name = e.getKey();
      Done d = e.getValue();
      Listed shown = listing.get(name);
      if (shown != null && shown.created == d.created()) {
        String node = d.node().isEmpty() ? shown.node : d.node();
        done.set(name, new Done(d.created(), node).json());
      } else if (gone(name, d.created(), d.node(), listing, byDir)) {
        moved = true; // deleted (and perhaps created again: read below as new)
      } else {
        done.set(name, d.json());
        keep(name, d.created());
      }
    }
    for (Map.Entry<String, JsonNode> e : was.properties()) {
      String name = e.getKey();
      JsonNode before = e.getValue();
      if (done.has(name) || listing.containsKey(name)) {
        continue; // read on below (or, created again, from its start)
      }
      long created = before.get("c").asLong();
      if (gone(name, created, before.path("n").asText(""), listing, byDir)) {
        LOG.warn("segments-jvm: {} was deleted; what was not read of it is lost", name);
        moved = true;
      } else {
        // Not shown, not proven deleted: kept where it was, nothing read.
        ObjectNode kept = ((ObjectNode) before).deepCopy();
        kept.set("from", before.get("at"));
        segments.set(name, kept);
        keep(name, created);
      }
    }
    for (Listed seg : listed) {
      JsonNode finished = done.get(seg.name);
      if (finished != null && Done.of(finished).created() == seg.created) {
        continue;
      }
      JsonNode before = was.get(seg.name);
      long pos;
      if (before != null && before.get("c").asLong() == seg.created) {
        pos = before.get("at").asLong();
      } else {
        if (before != null) {
          LOG.warn("segments-jvm: {} was deleted and created again", seg.name);
        }
        pos = first(seg);
        moved = true;
      }
      if (pos < seg.startOffset) {
        long first = first(seg);
        LOG.warn("segments-jvm: {} was truncated at {}; {} byte(s) not read are skipped",
            seg.name, seg.startOffset, first - pos);
        pos = first;
        moved = true;
      }
      long end = Math.max(pos, seg.end);
      if (limited && end > pos) {
        if (budget <= 0) {
          end = pos;
        } else if (bytesLimit) {
          end = Cuts.bytesCut(seg.file, seg.codec, pos, end, budget);
          budget -= end - pos;
        } else {
          long[] cut = Cuts.countCut(seg.file, seg.codec, pos, end, budget);
          end = cut[0];
          budget -= cut[1];
        }
      }
      if (end > pos) {
        moved = true;
      }
      ObjectNode entry = entry(seg, pos, end);
      if (seg.sealed) {
        entry.put("sealed", true);
        if (end >= seg.end) {
          // Read to its final end with this batch: finished. Listed once more, with the
          // range that finishes it.
          done.set(seg.name, new Done(seg.created, seg.node).json());
        }
      }
      segments.set(seg.name, entry);
    }
    return moved ? StreamOffset.of(segments, done) : null;
  }

  /** Say once that a segment the mount does not show is kept, not taken for deleted. */
  private void keep(String name, long created) {
    if (missing.add(name + "\u0000" + created)) {
      LOG.warn("segments-jvm: {} is not shown by the mount, and nothing shows it was deleted "
          + "(a gateway restarting, another node's segments not listed yet): kept, to be read "
          + "on from where it was when it shows again", name);
    }
  }

  @Override
  public Offset deserializeOffset(String json) {
    return StreamOffset.parse(json);
  }

  // -- batches ---------------------------------------------------------------------------

  /** The parts of every segment's [from, at) in end (stream.py partitions). */
  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    ObjectNode ranges = StreamOffset.of(end).segments();
    long total = 0;
    for (JsonNode r : ranges) {
      total += Math.max(0, r.get("at").asLong() - r.get("from").asLong());
    }
    // A batch is often one segment's new bytes: cut it so that every core has a part (parts
    // of at least MIN_PART, at most splitSize).
    long size = Math.min(options.splitSize, Math.max(MIN_PART, -Math.floorDiv(-total, minPartitions)));
    Path top = Paths.get(root());
    List<InputPartition> parts = new ArrayList<>();
    for (Map.Entry<String, JsonNode> e : ranges.properties()) {
      String name = e.getKey();
      JsonNode r = e.getValue();
      long lo = r.get("from").asLong();
      long hi = r.get("at").asLong();
      if (hi <= lo) {
        continue;
      }
      Path file = top.resolve(name);
      String f = file.toString();
      boolean sealed = r.path("sealed").asBoolean(false);
      List<Part> planned = new ArrayList<>();
      if (r.path("k").asText("").equals("lines")) {
        for (long a = lo; a < hi; a += size) {
          planned.add(Part.lines(f, name, a, Math.min(a + size, hi), hi, a == lo, sealed, true));
        }
      } else {
        List<Long> index = new ArrayList<>(List.of(lo));
        if (hi - lo > size) {
          // The index only cuts the range into parts: one part without it.
          try {
            for (long x : Planner.readEventIndex(file, 0)) {
              if (lo < x && x < hi) {
                index.add(x);
              }
            }
          } catch (IOException ignored) {
            // no index: one part
          }
        }
        for (long[] ab : Planner.split(index, lo, hi, size)) {
          planned.add(Part.framed(f, name, ab[0], ab[1], ab[0], ab[1], sealed));
        }
      }
      for (Part p : planned) {
        p.created = r.get("c").asLong();
        p.node = r.path("n").asText("");
        p.stream = true;
      }
      parts.addAll(planned);
    }
    // stream.py also opens active segments' parts with O_DIRECT, so that the kernel's copy of
    // a growing file's size cannot cut a read short. Not needed here: the gateway serves every
    // open of an active segment as direct I/O (fs/vfs.py open), whatever the flags; and the
    // JDK's O_DIRECT (ExtendedOpenOption.DIRECT) would want block-aligned reads.
    return parts.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new PartReaders(SegmentsJvmSource.SCHEMA);
  }

  /** Nothing to release: the segments are the gateway's. */
  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "segments-jvm " + options.path;
  }
}
