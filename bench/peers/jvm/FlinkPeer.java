// Flink folding the order backlog for `make bench-peers`: its in-JVM MiniCluster
// (a local environment, parallelism 2), the Kafka source bounded at the log's end, keyed by
// order, the state per order a ValueState (JSON, heap state backend) under exactly-once
// checkpoints every second; refold's Avro decoded by OrderFold. The Redis variant
// (--redis-url) writes each new state to Redis with a Jedis pipeline, flushed every 1,000
// records and at each checkpoint; the in-memory variant writes its states (--states) when
// the bounded job has finished.
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.KafkaSourceBuilder;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;

public final class FlinkPeer {
  /** One record of the backlog (a Flink POJO). */
  public static class Rec {
    public String key;
    public int partition;
    public long offset;
    public byte[] value;
  }

  /** A new state, for the sink. */
  public static class Out {
    public String key;
    public byte[] json;
  }

  // One JVM (the MiniCluster): every task shares the progress file and the states' mirror.
  static OrderFold.Progress progress;
  static final Map<String, Object[]> MIRROR = new ConcurrentHashMap<>();
  static boolean keepStates;

  static final class Fold extends KeyedProcessFunction<String, Rec, Out> {
    private final OrderFold fold;
    private transient ValueState<byte[]> state;

    Fold(OrderFold fold) {
      this.fold = fold;
    }

    @Override
    public void open(OpenContext context) {
      state = getRuntimeContext().getState(new ValueStateDescriptor<>("order", byte[].class));
    }

    @Override
    public void processElement(Rec rec, Context context, Collector<Out> out) throws Exception {
      byte[] old = state.value();
      Map<String, Object> before =
          old == null ? null : OrderFold.JSON.readValue(old, OrderFold.STATE);
      Map<String, Object> next = fold.apply(before, rec.value);
      if (next != null && next != before) {
        Out o = new Out();
        o.key = rec.key;
        o.json = OrderFold.JSON.writeValueAsBytes(next);
        state.update(o.json);
        if (keepStates) MIRROR.put(rec.key, new Object[] {rec.offset, next});
        out.collect(o);
      }
      progress.seen(rec.partition, rec.offset);
    }
  }

  static final class RedisSink implements Sink<Out> {
    private final String url;
    private final String prefix;

    RedisSink(String url, String prefix) {
      this.url = url;
      this.prefix = prefix;
    }

    @Override
    public SinkWriter<Out> createWriter(WriterInitContext context) {
      Jedis jedis = url == null ? null : new Jedis(java.net.URI.create(url));
      Pipeline pipeline = jedis == null ? null : jedis.pipelined();
      return new SinkWriter<>() {
        int pending;

        @Override
        public void write(Out out, Context context) {
          if (pipeline == null) return;
          pipeline.set((prefix + ":" + out.key).getBytes(), out.json);
          if (++pending >= 1000) flush(false);
        }

        @Override
        public void flush(boolean endOfInput) {
          if (pipeline != null && pending > 0) {
            pipeline.sync();
            pending = 0;
          }
        }

        @Override
        public void close() {
          flush(true);
          if (jedis != null) jedis.close();
        }
      };
    }
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = OrderFold.flags(args);
    OrderFold fold = new OrderFold(flags.get("schemas"));
    progress = new OrderFold.Progress(flags.get("progress"), OrderFold.ends(flags.get("ends")));
    keepStates = flags.containsKey("states");
    Configuration conf = new Configuration();
    conf.setString("state.backend.type", "hashmap");
    conf.setString("execution.checkpointing.dir", "file://" + flags.get("work-dir") + "/checkpoints");
    conf.setString("rest.bind-port", "0");
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(2, conf);
    env.enableCheckpointing(1000, CheckpointingMode.EXACTLY_ONCE);
    KafkaSourceBuilder<Rec> builder = KafkaSource.<Rec>builder()
        .setBootstrapServers(flags.get("bootstrap"))
        .setTopics(flags.get("topic"))
        .setGroupId(flags.get("group"))
        .setStartingOffsets(OffsetsInitializer.earliest());
    // A bounded job ends at the log's end; "--tail true" (the latency run) reads on until stopped.
    if (!"true".equals(flags.get("tail"))) builder.setBounded(OffsetsInitializer.latest());
    KafkaSource<Rec> source = builder
        .setDeserializer(new KafkaRecordDeserializationSchema<Rec>() {
          @Override
          public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<Rec> out) {
            Rec rec = new Rec();
            rec.key = new String(record.key());
            rec.partition = record.partition();
            rec.offset = record.offset();
            rec.value = record.value();
            out.collect(rec);
          }

          @Override
          public TypeInformation<Rec> getProducedType() {
            return TypeInformation.of(Rec.class);
          }
        })
        .build();
    env.fromSource(source, WatermarkStrategy.noWatermarks(), "orders")
        .keyBy(rec -> rec.key)
        .process(new Fold(fold))
        .sinkTo(new RedisSink(flags.get("redis-url"), flags.getOrDefault("redis-prefix", "peers")));
    env.execute("orders");
    progress.write();
    if (keepStates) {
      Map<String, Object> out = new LinkedHashMap<>(MIRROR);
      Files.write(Path.of(flags.get("states")), OrderFold.JSON.writeValueAsBytes(out));
    }
  }
}
