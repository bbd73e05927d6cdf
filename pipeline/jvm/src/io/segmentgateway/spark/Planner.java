package io.segmentgateway.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;

/**
 * Plans the parts of the segments under a mounted path: pipeline/source.py's
 * SegmentsReader.partitions, rule for rule (the tests compare the two sources' rows).
 */
final class Planner {
  private final Options options;
  /** Names wanted (segment = / IN filters); null: any. */
  private final Set<String> names;
  /** Prefixes every wanted name starts with (StringStartsWith filters). */
  private final List<String> prefixes;

  Planner(Options options, Set<String> names, List<String> prefixes) {
    this.options = options;
    this.names = names;
    this.prefixes = prefixes;
  }

  private boolean wanted(String segment) {
    if (names != null && !names.contains(segment)) {
      return false;
    }
    for (String p : prefixes) {
      if (!segment.startsWith(p)) {
        return false;
      }
    }
    return true;
  }

  /** Parts of every wanted segment, cut at indexed event boundaries (or every splitSize for lines). */
  List<Part> parts() throws IOException {
    Path root = mountRoot(Paths.get(options.path).toAbsolutePath().normalize());
    List<Part> parts = new ArrayList<>();
    long split = options.splitSize;
    for (Path file : listSegmentFiles(Paths.get(options.path).toAbsolutePath().normalize())) {
      String segment = root.relativize(file).toString();
      if (!wanted(segment)) {
        continue;
      }
      String f = file.toString();
      // Sealed before the length: a segment seen sealed has its final length.
      boolean sealed;
      long length;
      long startOffset;
      long fin;
      List<Long> index;
      String codec;
      try {
        sealed = "1".equals(xattr(file, "segment.sealed"));
        if (!sealed && !options.includeActive) {
          continue;
        }
        fin = sealed ? Long.parseLong(xattr(file, "segment.length")) : -1;
        length = Files.size(file);
        startOffset = Long.parseLong(xattr(file, "segment.start_offset"));
        index = readEventIndex(file, startOffset);
        codec = options.codec.isEmpty() ? declaredCodec(file) : options.codec;
      } catch (NoSuchFileException e) {
        continue; // deleted since it was listed
      }
      long lo = Math.max(options.lo, startOffset);
      long hi = Math.min(options.hi, length);
      if (codec.equals("lines")) {
        // Below the start offset are zeros: whether a line starts at it is
        // known only if it is an indexed (append) boundary.
        boolean head = lo == 0 || (lo == startOffset && index.contains(startOffset));
        boolean complete = length == fin;
        for (long a = lo; a < hi; a += split) {
          long b = Math.min(a + split, hi);
          parts.add(Part.lines(f, segment, a, b, length, head && a == lo, sealed, complete));
        }
        continue;
      }
      if (lo >= hi || index.isEmpty()) {
        continue;
      }
      // Parsing starts at an indexed boundary: the last at or below lo.
      int k = index.size();
      for (int i = 0; i < index.size(); i++) {
        if (index.get(i) > lo) {
          k = i;
          break;
        }
      }
      k = Math.max(0, k - 1);
      long start = index.get(k);
      if (start > lo) { // lo is below the first boundary (truncated mid-event)
        lo = start;
      }
      for (long[] ab : split(index.subList(k, index.size()), start, length, split)) {
        if (ab[1] > lo && ab[0] < hi) {
          parts.add(Part.framed(f, segment, ab[0], ab[1], Math.max(lo, ab[0]),
              Math.min(hi, ab[1]), sealed));
        }
      }
    }
    return parts;
  }

  /** [start, end) cut at indexed boundaries once a part reaches size bytes (parts.py split). */
  static List<long[]> split(List<Long> index, long start, long end, long size) {
    List<long[]> parts = new ArrayList<>();
    int i = 0;
    while (start < end) {
      long target = start + size;
      while (i < index.size() && index.get(i) < target) {
        i++;
      }
      long cut = i < index.size() && index.get(i) < end ? index.get(i) : end;
      parts.add(new long[] {start, cut});
      start = cut;
    }
    return parts;
  }

  /** A user.* xattr of the file as text; NoSuchFileException if the file is gone. */
  static String xattr(Path file, String name) throws IOException {
    return Mount.xattr(file, name);
  }

  /** The segment's own codec if it declared lines or framed, else framed. */
  static String declaredCodec(Path file) throws IOException {
    String codec;
    try {
      codec = xattr(file, "segment.codec");
    } catch (NoSuchFileException e) {
      throw e;
    } catch (IOException e) {
      return "framed";
    }
    return codec.equals("lines") || codec.equals("framed") ? codec : "framed";
  }

  /** The offsets at or above startOffset in the segment's .NAME.events file. */
  static List<Long> readEventIndex(Path file, long startOffset) throws IOException {
    Path events = file.resolveSibling("." + file.getFileName() + ".events");
    List<Long> out = new ArrayList<>();
    String text;
    try {
      text = new String(Files.readAllBytes(events), StandardCharsets.US_ASCII);
    } catch (NoSuchFileException e) {
      return out;
    }
    for (String word : text.trim().split("\\s+")) {
      if (!word.isEmpty()) {
        long b = Long.parseLong(word);
        if (b >= startOffset) {
          out.add(b);
        }
      }
    }
    return out;
  }

  /** Segment files at or under path, in os.walk's order; hidden and _ names skipped. */
  static List<Path> listSegmentFiles(Path path) throws IOException {
    List<Path> found = new ArrayList<>();
    if (Files.isRegularFile(path)) {
      found.add(path);
      return found;
    }
    walk(path, found);
    return found;
  }

  private static void walk(Path directory, List<Path> found) throws IOException {
    List<String> dirs = new ArrayList<>();
    List<String> files = new ArrayList<>();
    try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
      for (Path entry : entries) {
        String name = entry.getFileName().toString();
        boolean hidden = name.startsWith(".") || name.startsWith("_");
        if (Files.isDirectory(entry)) {
          if (!hidden) {
            dirs.add(name);
          }
        } else if (!hidden) {
          files.add(name);
        }
      }
    } catch (IOException e) {
      if (Mount.notFound(Mount.errno(e))) {
        return; // a directory deleted while listed
      }
      throw e;
    }
    Collections.sort(files);
    Collections.sort(dirs);
    for (String f : files) {
      found.add(directory.resolve(f));
    }
    for (String d : dirs) {
      walk(directory.resolve(d), found);
    }
  }

  /** The gateway mount's point above path (segment names are relative to it), else the nearest mount. */
  static Path mountRoot(Path path) throws IOException {
    return Mount.mountRoot(path);
  }
}
