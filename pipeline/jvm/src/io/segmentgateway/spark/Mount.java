package io.segmentgateway.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.NotDirectoryException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.UserDefinedFileAttributeView;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The gateway's mount as pipeline/parts.py sees it: the mount table, whether a live gateway
 * mount is at a point (check_mount), the segments' user.* xattrs, and the errno behind an
 * IOException (Java gives the C library's message, not the number).
 */
final class Mount {
  /** The gateway mount's type in /proc/self/mountinfo (pipeline/parts.py MOUNT_TYPE). */
  static final String MOUNT_TYPE = "fuse.segment-gateway";
  private static final Pattern OCTAL = Pattern.compile("\\\\([0-7]{3})");

  static final int EPERM = 1;
  static final int ENOENT = 2;
  static final int EIO = 5;
  static final int EACCES = 13;
  static final int ENOTDIR = 20;
  static final int ENAMETOOLONG = 36;
  static final int ENODATA = 61;
  static final int ENOTCONN = 107;
  static final int ESTALE = 116;
  /** strerror's text of each errno told apart here (glibc's wording, which the JDK shows). */
  private static final String[] TEXTS = {
    "No such file or directory", "Stale file handle", "No data available",
    "Transport endpoint is not connected", "Permission denied", "Operation not permitted",
    "File name too long", "Not a directory", "Input/output error",
  };
  private static final int[] NUMBERS = {
    ENOENT, ESTALE, ENODATA, ENOTCONN, EACCES, EPERM, ENAMETOOLONG, ENOTDIR, EIO,
  };

  private Mount() {}

  /** The gateway's mount cannot be read now: its daemon is down or restarting (ENOTCONN). */
  static final class Unavailable extends IOException {
    private static final long serialVersionUID = 1L;

    Unavailable(String message) {
      super(message);
    }

    Unavailable(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** One line of /proc/self/mountinfo: mount id, mount point, filesystem type. */
  record Entry(String id, String point, String type) {}

  /** Every mount, in mount order. */
  static List<Entry> mounts() throws IOException {
    List<Entry> out = new ArrayList<>();
    for (String line : Files.readAllLines(Paths.get("/proc/self/mountinfo"))) {
      String[] fields = line.split(" ");
      int sep = -1;
      for (int i = 0; i < fields.length; i++) {
        if (fields[i].equals("-")) {
          sep = i;
          break;
        }
      }
      if (sep < 0 || fields.length < sep + 2 || fields.length < 5) {
        continue;
      }
      out.add(new Entry(fields[0], unescape(fields[4]), fields[sep + 1]));
    }
    return out;
  }

  private static boolean inside(String path, String point) {
    return path.equals(point) || path.startsWith(point.endsWith("/") ? point : point + "/");
  }

  /**
   * The mount point of the gateway mount that holds path, or null (parts.py gateway_mount).
   * Found in the mount table, so a mount whose daemon died still counts.
   */
  static String gatewayMount(Path path) throws IOException {
    String p = path.toAbsolutePath().normalize().toString();
    String best = null;
    for (Entry m : mounts()) {
      if (m.type().equals(MOUNT_TYPE) && inside(p, m.point())
          && (best == null || m.point().length() > best.length())) {
        best = m.point();
      }
    }
    return best;
  }

  /** The gateway mount's point above path, else the nearest mount (segment names are below it). */
  static Path mountRoot(Path path) throws IOException {
    String p = path.toString();
    String best = null;
    String any = null;
    for (Entry m : mounts()) {
      if (!inside(p, m.point())) {
        continue;
      }
      if (any == null || m.point().length() > any.length()) {
        any = m.point();
      }
      if (m.type().equals(MOUNT_TYPE) && (best == null || m.point().length() > best.length())) {
        best = m.point();
      }
    }
    String root = best != null ? best : any;
    return Paths.get(root == null ? "/" : root);
  }

  /**
   * The id of the live gateway mount at root; Unavailable if there is none (parts.py
   * check_mount). Live: the topmost mount at root is the gateway's and answers statvfs (a
   * killed daemon's mount answers ENOTCONN; while the next start mounts again, root is a plain
   * directory for a moment).
   */
  static String check(String root) throws IOException {
    Entry top = null;
    for (Entry m : mounts()) {
      if (m.point().equals(root)) {
        top = m;
      }
    }
    if (top == null || !top.type().equals(MOUNT_TYPE)) {
      String what = top == null ? "nothing" : "a " + top.type() + " filesystem";
      throw new Unavailable("no segment-gateway mount at " + root + " (" + what + ")");
    }
    try {
      Files.getFileStore(Paths.get(root)).getTotalSpace(); // statvfs: always asks the daemon
    } catch (IOException e) {
      throw new Unavailable(
          "the segment-gateway mount at " + root + " does not answer: " + e.getMessage(), e);
    }
    return top.id();
  }

  /**
   * A user.* xattr of the file as text ("segment.sealed" for user.segment.sealed);
   * NoSuchFileException if the file is gone. The JDK opens the file for each call: one call
   * with a buffer the mount's values fit in, not two (size, then value).
   */
  static String xattr(Path file, String name) throws IOException {
    UserDefinedFileAttributeView view =
        Files.getFileAttributeView(file, UserDefinedFileAttributeView.class);
    ByteBuffer buf = ByteBuffer.allocate(256);
    try {
      view.read(name, buf);
    } catch (FileSystemException e) {
      if (e.getMessage() == null || !e.getMessage().contains("Insufficient space")) {
        throw e;
      }
      buf = ByteBuffer.allocate(view.size(name));
      view.read(name, buf);
    }
    buf.flip();
    return StandardCharsets.UTF_8.decode(buf).toString();
  }

  /** A numeric xattr of the file. */
  static long number(Path file, String name) throws IOException {
    return Long.parseLong(xattr(file, name).trim());
  }

  /** The errno behind an I/O error (its cause chain's first known one), 0 if not known. */
  static int errno(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof Unavailable) {
        return ENOTCONN;
      }
      if (t instanceof NoSuchFileException) {
        return ENOENT;
      }
      if (t instanceof AccessDeniedException) {
        return EACCES;
      }
      if (t instanceof NotDirectoryException) {
        return ENOTDIR;
      }
      String m = t.getMessage();
      if (m != null) {
        for (int i = 0; i < TEXTS.length; i++) {
          if (m.contains(TEXTS[i])) {
            return NUMBERS[i];
          }
        }
      }
    }
    return 0;
  }

  /** Errors that no wait cures: raised at once (stream.py _PERMANENT). */
  static boolean permanent(int errno) {
    return errno == EACCES || errno == EPERM || errno == ENAMETOOLONG || errno == ENOTDIR;
  }

  /** Whether the error says the file is not there (deleted, or another segment's now). */
  static boolean notFound(int errno) {
    return errno == ENOENT || errno == ESTALE;
  }

  /** An ESTALE error for a file whose name holds another segment now. */
  static IOException stale(String file, String why) {
    return new FileSystemException(file, null, "Stale file handle (" + why + ")");
  }

  /** The IOException inside an UncheckedIOException, or the IOException itself. */
  static IOException io(Exception e) {
    if (e instanceof UncheckedIOException u) {
      return u.getCause();
    }
    return (IOException) e;
  }

  private static String unescape(String field) {
    Matcher m = OCTAL.matcher(field);
    StringBuilder out = new StringBuilder();
    while (m.find()) {
      m.appendReplacement(out, Matcher.quoteReplacement(
          String.valueOf((char) Integer.parseInt(m.group(1), 8))));
    }
    m.appendTail(out);
    return out.toString();
  }
}
