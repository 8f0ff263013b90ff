// Kafka Streams folding the order backlog for `make bench-peers`: exactly_once_v2, two stream
// threads, the state per order in a persistent (RocksDB) key-value store as JSON, refold's
// Avro decoded by OrderFold. The Redis variant (--redis-url) writes each new state to Redis
// with a Jedis pipeline, flushed every 1,000 records and every 100 ms. On SIGTERM the
// in-memory variant writes its store's states (--states), then the application closes.
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;

public final class KafkaStreamsPeer {
  static final String STORE = "orders";


  static final class Fold implements Processor<String, byte[], Void, Void> {
    private final OrderFold fold;
    private final OrderFold.Progress progress;
    private final String redisUrl;
    private final String prefix;
    private ProcessorContext<Void, Void> context;
    private KeyValueStore<String, byte[]> store;
    private Jedis jedis;
    private Pipeline pipeline;
    private int pending;

    Fold(OrderFold fold, OrderFold.Progress progress, String redisUrl, String prefix) {
      this.fold = fold;
      this.progress = progress;
      this.redisUrl = redisUrl;
      this.prefix = prefix;
    }

    @Override
    public void init(ProcessorContext<Void, Void> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
      if (redisUrl != null) {
        jedis = new Jedis(java.net.URI.create(redisUrl));
        pipeline = jedis.pipelined();
        context.schedule(Duration.ofMillis(100), PunctuationType.WALL_CLOCK_TIME, t -> flush());
      }
    }

    private void flush() {
      if (pending > 0) {
        pipeline.sync();
        pending = 0;
      }
    }

    @Override
    public void process(Record<String, byte[]> record) {
      try {
        byte[] old = store.get(record.key());
        Map<String, Object> state = old == null ? null : OrderFold.JSON.readValue(old, OrderFold.STATE);
        Map<String, Object> next = fold.apply(state, record.value());
        if (next != null && next != state) {
          byte[] json = OrderFold.JSON.writeValueAsBytes(next);
          store.put(record.key(), json);
          if (pipeline != null) {
            pipeline.set((prefix + ":" + record.key()).getBytes(), json);
            if (++pending >= 1000) flush();
          }
        }
        var meta = context.recordMetadata().orElseThrow();
        progress.seen(meta.partition(), meta.offset());
      } catch (java.io.IOException e) {
        throw new RuntimeException(e);
      }
    }

    @Override
    public void close() {
      if (jedis != null) {
        flush();
        jedis.close();
      }
    }
  }

  static void dump(KafkaStreams streams, String path) throws Exception {
    ReadOnlyKeyValueStore<String, byte[]> store =
        streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.keyValueStore()));
    Map<String, Object> out = new LinkedHashMap<>();
    try (KeyValueIterator<String, byte[]> all = store.all()) {
      while (all.hasNext()) {
        KeyValue<String, byte[]> entry = all.next();
        out.put(entry.key, new Object[] {0, OrderFold.JSON.readValue(entry.value, OrderFold.STATE)});
      }
    }
    Files.write(Path.of(path), OrderFold.JSON.writeValueAsBytes(out));
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = OrderFold.flags(args);
    String schemas = flags.get("schemas");  // an OrderFold per task: its decoder is reused
    OrderFold.Progress progress =
        new OrderFold.Progress(flags.get("progress"), OrderFold.ends(flags.get("ends")));
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, flags.get("group"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, flags.get("work-dir") + "/state");
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    props.put("auto.offset.reset", "earliest");
    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(Stores.keyValueStoreBuilder(
        Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()));
    String redisUrl = flags.get("redis-url");
    String prefix = flags.getOrDefault("redis-prefix", "peers");
    builder.stream(flags.get("topic"), Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .process(() -> new Fold(new OrderFold(schemas), progress, redisUrl, prefix), STORE);
    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();  // the run fails: the orchestrator sees the process end
      Runtime.getRuntime().halt(1);
      return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        if (flags.containsKey("states")) dump(streams, flags.get("states"));
      } catch (Exception e) {
        e.printStackTrace();
      }
      streams.close(Duration.ofSeconds(20));
      stopped.countDown();
    }));
    streams.start();
    stopped.await();
  }
}
