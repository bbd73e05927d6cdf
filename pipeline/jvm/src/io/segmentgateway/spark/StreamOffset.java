package io.segmentgateway.spark;

import java.util.Map;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * The streaming source's offset: pipeline/stream.py's JSON object, {"segments": {name: {"c",
 * "from", "at", "k", "n"[, "sealed"]}}, "done": {name: [created, node]}}, written as Python's
 * json.dumps writes it, so the two sources' offsets are the same text and a checkpoint written
 * by one is read by the other.
 */
final class StreamOffset extends Offset {
  static final JsonNodeFactory NODES = JsonNodeFactory.instance;
  private static final ObjectMapper JSON = new ObjectMapper();

  private final ObjectNode value;
  private final String json;

  StreamOffset(ObjectNode value) {
    this.value = value;
    StringBuilder out = new StringBuilder();
    write(value, out);
    this.json = out.toString();
  }

  /** {"segments": segments, "done": done}. */
  static StreamOffset of(ObjectNode segments, ObjectNode done) {
    ObjectNode value = NODES.objectNode();
    value.set("segments", segments);
    value.set("done", done);
    return new StreamOffset(value);
  }

  /** An offset as Spark hands it over (ours, or another's JSON text). */
  static StreamOffset of(Offset offset) {
    return offset instanceof StreamOffset s ? s : parse(offset.json());
  }

  static StreamOffset parse(String json) {
    try {
      JsonNode node = JSON.readTree(json);
      if (!(node instanceof ObjectNode o)) {
        throw new IllegalArgumentException("segments-jvm: an offset must be a JSON object: " + json);
      }
      return new StreamOffset(o);
    } catch (JsonProcessingException e) {
      throw new IllegalArgumentException("segments-jvm: not an offset: " + json, e);
    }
  }

  /** The segments being read: name -> {"c", "from", "at", "k", "n"[, "sealed"]}. */
  ObjectNode segments() {
    JsonNode s = value.get("segments");
    return s instanceof ObjectNode o ? o : NODES.objectNode();
  }

  /** The sealed segments read to their end: name -> [created, node] (or a bare created). */
  ObjectNode done() {
    JsonNode d = value.get("done");
    return d instanceof ObjectNode o ? o : NODES.objectNode();
  }

  @Override
  public String json() {
    return json;
  }

  /** As Python's json.dumps: ", " and ": " between items, non-ASCII escaped. */
  private static void write(JsonNode n, StringBuilder out) {
    if (n.isObject()) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<String, JsonNode> e : n.properties()) {
        if (!first) {
          out.append(", ");
        }
        first = false;
        quote(e.getKey(), out);
        out.append(": ");
        write(e.getValue(), out);
      }
      out.append('}');
    } else if (n.isArray()) {
      out.append('[');
      for (int i = 0; i < n.size(); i++) {
        if (i > 0) {
          out.append(", ");
        }
        write(n.get(i), out);
      }
      out.append(']');
    } else if (n.isTextual()) {
      quote(n.textValue(), out);
    } else if (n.isBoolean()) {
      out.append(n.booleanValue() ? "true" : "false");
    } else if (n.isNull()) {
      out.append("null");
    } else {
      out.append(n.asText()); // numbers (integers here)
    }
  }

  private static void quote(String s, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"': out.append("\\\""); break;
        case '\\': out.append("\\\\"); break;
        case '\n': out.append("\\n"); break;
        case '\r': out.append("\\r"); break;
        case '\t': out.append("\\t"); break;
        case '\b': out.append("\\b"); break;
        case '\f': out.append("\\f"); break;
        default:
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }
}
