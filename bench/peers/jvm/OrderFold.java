// order_state's fold for the JVM peers of `make bench-peers` (KafkaStreamsPeer, FlinkPeer):
// refold's Avro single-object encoding decoded with Avro's Java library (the writer schema
// found by its CRC-64-AVRO fingerprint among refold's .avsc files, resolved to the newest
// version of its type), then the rules of refold/processors/order_state/projection.py, ported
// line by line; a rejected event leaves the state as it was. States are JSON maps (Jackson),
// the same JSON refold stores. Also the progress file every peer writes (bench/peers/report.py).
import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;

// Not thread-safe (it reuses its decoder): one per task.
public final class OrderFold implements java.io.Serializable {
  public static final ObjectMapper JSON = new ObjectMapper();
  public static final TypeReference<Map<String, Object>> STATE = new TypeReference<>() {};
  private final String schemas;
  private transient Map<Long, GenericDatumReader<GenericRecord>> readers;
  private transient BinaryDecoder decoder;

  public OrderFold(String schemas) {
    this.schemas = schemas;
  }

  private void load() throws IOException {
    Map<String, Schema> newest = new HashMap<>();
    Map<String, Integer> versions = new HashMap<>();
    List<Schema> all = new ArrayList<>();
    File[] files = new File(schemas).listFiles((dir, name) -> name.endsWith(".avsc"));
    for (File file : files) {
      Schema schema = new Schema.Parser().parse(file);
      String[] parts = file.getName().split("\\.");
      int version = Integer.parseInt(parts[parts.length - 2].substring(1));
      all.add(schema);
      if (version > versions.getOrDefault(schema.getName(), 0)) {
        versions.put(schema.getName(), version);
        newest.put(schema.getName(), schema);
      }
    }
    readers = new HashMap<>();
    for (Schema writer : all) {
      long fingerprint = SchemaNormalization.parsingFingerprint64(writer);
      readers.put(fingerprint, new GenericDatumReader<>(writer, newest.get(writer.getName())));
    }
  }

  /** The record's fields, or null when it is not one of the catalog's records. */
  public GenericRecord decode(byte[] value) throws IOException {
    if (readers == null) load();
    if (value == null || value.length < 10 || value[0] != (byte) 0xC3 || value[1] != 1) return null;
    long fingerprint = ByteBuffer.wrap(value, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
    GenericDatumReader<GenericRecord> reader = readers.get(fingerprint);
    if (reader == null) return null;
    decoder = DecoderFactory.get().binaryDecoder(value, 10, value.length - 10, decoder);
    return reader.read(null, decoder);
  }

  /** The state after one record (Avro bytes), or the state as it was if rejected. */
  public Map<String, Object> apply(Map<String, Object> state, byte[] value) throws IOException {
    GenericRecord event = decode(value);
    if (event == null) return state;
    Map<String, Object> next = fold(state, event.getSchema().getName(), event);
    return next == null ? state : next;
  }

  private static String str(GenericRecord event, String field) {
    Object value = event.get(field);
    return value == null ? null : value.toString();
  }

  private static long num(Object value) {
    return ((Number) value).longValue();
  }

  @SuppressWarnings("unchecked")
  private static Map<String, Map<String, Object>> lines(Map<String, Object> state) {
    return new LinkedHashMap<>((Map<String, Map<String, Object>>) state.get("lines"));
  }

  private static Map<String, Object> line(long qty, long price) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("qty", qty);
    line.put("unit_price_minor", price);
    return line;
  }

  private static Map<String, Object> withLines(
      Map<String, Object> state, Map<String, Map<String, Object>> lines, long items, long total,
      long at) {
    Map<String, Object> next = new LinkedHashMap<>(state);
    next.put("lines", lines);
    next.put("items", items);
    next.put("total_minor", total);
    next.put("updated_at", at);
    next.put("events", num(state.get("events")) + 1);
    return next;
  }

  private static Map<String, Object> moved(Map<String, Object> state, String status, long at) {
    Map<String, Object> next = new LinkedHashMap<>(state);
    next.put("status", status);
    next.put("updated_at", at);
    next.put("events", num(state.get("events")) + 1);
    return next;
  }

  /** order_state's rules; null when the event is rejected. */
  static Map<String, Object> fold(Map<String, Object> state, String type, GenericRecord e) {
    if (type.equals("OrderPlaced")) {
      if (state != null) return null;
      Map<String, Map<String, Object>> lines = new LinkedHashMap<>();
      long items = 0;
      long total = 0;
      for (Object raw : (List<?>) e.get("lines")) {
        GenericRecord l = (GenericRecord) raw;
        Map<String, Object> old = lines.get(str(l, "sku"));
        long qty = num(l.get("qty")) + (old == null ? 0 : num(old.get("qty")));
        lines.put(str(l, "sku"), line(qty, num(l.get("unit_price_minor"))));
      }
      for (Map<String, Object> l : lines.values()) {
        items += num(l.get("qty"));
        total += num(l.get("qty")) * num(l.get("unit_price_minor"));
      }
      Map<String, Object> base = new LinkedHashMap<>();
      base.put("order_id", str(e, "order_id"));
      base.put("customer_id", str(e, "customer_id"));
      base.put("status", "placed");
      base.put("currency", str(e, "currency"));
      base.put("channel", e.hasField("channel") ? str(e, "channel") : "web");
      base.put("placed_at", num(e.get("placed_at")));
      base.put("paid_minor", 0L);
      base.put("events", 0L);
      return withLines(base, lines, items, total, num(e.get("placed_at")));
    }
    if (state == null) return null;
    String status = (String) state.get("status");
    switch (type) {
      case "OrderLineAdded": {
        if (!status.equals("placed")) return null;
        Map<String, Map<String, Object>> lines = lines(state);
        String sku = str(e, "sku");
        Map<String, Object> old = lines.get(sku);
        long qty = num(e.get("qty")) + (old == null ? 0 : num(old.get("qty")));
        long price = num(e.get("unit_price_minor"));
        lines.put(sku, line(qty, price));
        long oldTotal = old == null ? 0 : num(old.get("qty")) * num(old.get("unit_price_minor"));
        return withLines(state, lines, num(state.get("items")) + num(e.get("qty")),
            num(state.get("total_minor")) - oldTotal + qty * price, num(e.get("added_at")));
      }
      case "OrderLineRemoved": {
        if (!status.equals("placed")) return null;
        Map<String, Map<String, Object>> lines = lines(state);
        Map<String, Object> gone = lines.remove(str(e, "sku"));
        if (gone == null) return null;
        long qty = num(gone.get("qty"));
        return withLines(state, lines, num(state.get("items")) - qty,
            num(state.get("total_minor")) - qty * num(gone.get("unit_price_minor")),
            num(e.get("removed_at")));
      }
      case "OrderPaid": {
        if (!status.equals("placed")) return null;
        if (!str(e, "currency").equals(state.get("currency"))
            || num(e.get("amount_minor")) != num(state.get("total_minor"))) return null;
        Map<String, Object> next = moved(state, "paid", num(e.get("paid_at")));
        next.put("paid_minor", num(e.get("amount_minor")));
        next.put("payment_method", str(e, "payment_method"));
        return next;
      }
      case "OrderShipped": {
        if (!status.equals("paid")) return null;
        Map<String, Object> next = moved(state, "shipped", num(e.get("shipped_at")));
        next.put("carrier", str(e, "carrier"));
        return next;
      }
      case "OrderCancelled": {
        if (!status.equals("placed") && !status.equals("paid")) return null;
        Map<String, Object> next = moved(state, "cancelled", num(e.get("cancelled_at")));
        next.put("cancel_reason", str(e, "reason"));
        return next;
      }
      default:
        return null;
    }
  }

  /**
   * The progress file of bench/peers/report.py, rewritten whole. Light in the fold's path, as
   * the Python peers' is: per record a read of the first time and a comparison with the
   * partition's end; the lock and the clock only at the first record, at each partition's last
   * and every 8,192 records of a thread.
   */
  public static final class Progress implements java.io.Serializable {
    private final String path;
    private final Map<Integer, Long> ends;
    private volatile Double first;
    private final Map<Integer, Long> offsets = new HashMap<>();
    private final Map<Integer, Double> reached = new HashMap<>();
    private long written;
    private final transient ThreadLocal<int[]> counts = ThreadLocal.withInitial(() -> new int[1]);

    public Progress(String path, Map<Integer, Long> ends) {
      this.path = path;
      this.ends = ends;
    }

    public void seen(int partition, long offset) throws IOException {
      boolean last = offset + 1 >= ends.getOrDefault(partition, 0L);
      int[] count = counts.get();
      if (first != null && !last && (++count[0] & 8191) != 0) return;
      synchronized (this) {
        long now = System.currentTimeMillis();
        boolean write = false;
        if (first == null) {
          first = now / 1000.0;
          write = true;
        }
        if (offset > offsets.getOrDefault(partition, -1L)) offsets.put(partition, offset);
        if (last && !reached.containsKey(partition)) {
          reached.put(partition, now / 1000.0);
          write = true;
        }
        if (write || now - written >= 1000) write();
      }
    }

    public synchronized void write() throws IOException {
      written = System.currentTimeMillis();
      Map<String, Object> body = new LinkedHashMap<>();
      body.put("first", first);
      body.put("offsets", offsets);
      body.put("reached", reached);
      Path tmp = Path.of(path + ".tmp");
      Files.write(tmp, JSON.writeValueAsBytes(body));
      Files.move(tmp, Path.of(path), StandardCopyOption.REPLACE_EXISTING);
    }
  }

  /** The flags of bench/peers/args.py: --name value pairs. */
  public static Map<String, String> flags(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) out.put(args[i].substring(2), args[i + 1]);
    return out;
  }

  public static Map<Integer, Long> ends(String spec) {
    Map<Integer, Long> out = new HashMap<>();
    for (String pair : spec.split(",")) {
      String[] parts = pair.split(":");
      out.put(Integer.parseInt(parts[0]), Long.parseLong(parts[1]));
    }
    return out;
  }
}
