package io.p4bs.flink;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.metrics.Counter;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.types.Row;

/**
 * Sums a link's window of interval records (LinkCounters v3, the Kafka value's raw bytes, read
 * by {@link IntervalReader}): the counts the metrics need, the flow events, and the RTT samples
 * reduced per flow (samples, sum of RTTs, minimum). Runs per sample, so it is Java: Flink SQL's
 * UNNEST costs about 15 µs per element here, over 10x this; and one decode of each record gives
 * all three, so a record counts whole or not at all.
 *
 * <p>A flow's key is built once per record, for the flows that have samples; the samples
 * themselves are only numbers. A sample whose flow index is not a position in the flows is
 * skipped and counted (metric skipped_rtt_samples); a value that does not decode, or whose sample
 * columns differ in length, adds nothing and is counted (malformed_link_counters) and logged: a
 * malformed record must not stop the job. A null value (a row of another kind) adds nothing.
 * Sums stop at Long.MAX_VALUE rather than wrap negative (the reader refuses negative counts and
 * RTTs, so only absurd values reach it).
 *
 * <p>Output: samples = all RTT samples; flows = distinct flows; inverse_sum = the sum over flows
 * of samples / sum of RTTs (1 / the flow's mean RTT, ns); min_ns = the smallest sample (null
 * without samples); flow_keys = the flows as "src:sport>dst:dport/protocol", sorted, an array
 * (null without samples); the summed counts (before-tap and after-tap bytes, data packets,
 * retransmissions, queueing-delay samples and their sum); flow_events = the events as an array of
 * ROW(ts_ns, started: true for a start, false for an end, flow), in no particular order (null
 * without events). Arrays, not text: no address or kind can be mistaken for a separator.
 */
@FunctionHint(
    input = @DataTypeHint("BYTES"),
    accumulator =
        @DataTypeHint(
            value = "RAW",
            bridgedTo = IntervalSummary.Sums.class,
            rawSerializer = IntervalSummary.SumsSerializer.class),
    output =
        @DataTypeHint(
            "ROW<samples BIGINT NOT NULL, flows INT NOT NULL, inverse_sum DOUBLE NOT NULL,"
                + " min_ns BIGINT, flow_keys " + IntervalSummary.FLOW_KEYS
                + ", `bytes` BIGINT NOT NULL,"
                + " after_bytes BIGINT NOT NULL, data_packets BIGINT NOT NULL,"
                + " retransmissions BIGINT NOT NULL, queue_delay_samples BIGINT NOT NULL,"
                + " queue_delay_sum_ns BIGINT NOT NULL, flow_events "
                + IntervalSummary.FLOW_EVENTS
                + ">"))
public class IntervalSummary extends AggregateFunction<Row, IntervalSummary.Sums> {
  private static final long serialVersionUID = 1L;
  /** The SQL types of the flows and the flow events, as LinkMetrics takes them. */
  static final String FLOW_KEYS = "ARRAY<STRING>",
      FLOW_EVENTS = "ARRAY<ROW<ts_ns BIGINT, started BOOLEAN, flow STRING>>";

  private static final int COUNT = 0, SUM = 1, MIN = 2;
  /** The summed counts, in the output's order. */
  private static final int COUNTS = 6;

  private transient Counter skipped;
  private transient Counter malformed;
  private transient IntervalReader reader;
  /** Per flow of the record being read: its statistics, looked up on its first sample. */
  private transient long[][] recordFlows;

  /** A window's sums so far. */
  public static final class Sums {
    /** Per flow key: {samples, sum of RTTs in ns, minimum RTT in ns}. */
    public final HashMap<String, long[]> byKey = new HashMap<>();
    /**
     * Before-tap bytes, after-tap bytes, data packets, retransmissions, queueing-delay samples,
     * their sum in ns.
     */
    public final long[] counts = new long[COUNTS];
    /** The flow events so far: ROW(ts_ns, started, flow), as IntervalReader reads them. */
    public final ArrayList<Row> flowEvents = new ArrayList<>(0);

    /** The flow's statistics, created empty (no samples, minimum above any RTT) if new. */
    long[] of(String key) {
      return byKey.computeIfAbsent(key, k -> new long[] {0, 0, Long.MAX_VALUE});
    }
  }

  /**
   * Writes an accumulator as its counts, its events (a flag, then the text), its flow count,
   * then per flow its key and three numbers. Flink serializes accumulators between the two
   * aggregation phases and into every checkpoint, and its generic (Kryo) serializer's string and
   * map handling showed in a profile of the job.
   */
  public static final class SumsSerializer extends FieldSerializer<Sums> {
    private static final long serialVersionUID = 1L;
    static final SumsSerializer INSTANCE = new SumsSerializer();

    @Override
    public Sums createInstance() {
      return new Sums();
    }

    @Override
    public Sums copy(Sums from) {
      Sums to = new Sums();
      for (Map.Entry<String, long[]> e : from.byKey.entrySet()) {
        to.byKey.put(e.getKey(), e.getValue().clone());
      }
      System.arraycopy(from.counts, 0, to.counts, 0, COUNTS);
      to.flowEvents.addAll(from.flowEvents); // rows never modified
      return to;
    }

    @Override
    public void serialize(Sums sums, DataOutputView target) throws IOException {
      for (long count : sums.counts) {
        target.writeLong(count);
      }
      target.writeInt(sums.flowEvents.size());
      for (Row event : sums.flowEvents) {
        target.writeLong((Long) event.getField(0));
        target.writeBoolean((Boolean) event.getField(1));
        target.writeUTF((String) event.getField(2)); // IntervalReader bounds its length
      }
      target.writeInt(sums.byKey.size());
      for (Map.Entry<String, long[]> e : sums.byKey.entrySet()) {
        target.writeUTF(e.getKey());
        long[] s = e.getValue();
        target.writeLong(s[COUNT]);
        target.writeLong(s[SUM]);
        target.writeLong(s[MIN]);
      }
    }

    @Override
    public Sums deserialize(DataInputView source) throws IOException {
      Sums sums = new Sums();
      for (int i = 0; i < COUNTS; i++) {
        sums.counts[i] = source.readLong();
      }
      for (int n = source.readInt(); n > 0; n--) {
        sums.flowEvents.add(Row.of(source.readLong(), source.readBoolean(), source.readUTF()));
      }
      for (int n = source.readInt(); n > 0; n--) {
        String key = source.readUTF();
        sums.byKey.put(key, new long[] {source.readLong(), source.readLong(), source.readLong()});
      }
      return sums;
    }

    @Override
    public TypeSerializerSnapshot<Sums> snapshotConfiguration() {
      return new SumsSerializerSnapshot();
    }
  }

  /** The serializer has no configuration: restoring it is creating it. */
  public static final class SumsSerializerSnapshot extends SimpleTypeSerializerSnapshot<Sums> {
    public SumsSerializerSnapshot() {
      super(() -> SumsSerializer.INSTANCE);
    }
  }

  @Override
  public void open(FunctionContext context) {
    skipped = JobCounters.counter(context, "skipped_rtt_samples");
    malformed = JobCounters.counter(context, IntervalReader.MALFORMED_METRIC);
    reader = new IntervalReader();
    recordFlows = new long[16][];
  }

  @Override
  public Sums createAccumulator() {
    return new Sums();
  }

  public void accumulate(Sums acc, byte[] record) {
    if (record == null) {
      return;
    }
    IntervalReader r = reader;
    try {
      r.read(record);
    } catch (AvroReader.Malformed e) {
      AvroReader.count(malformed, IntervalReader.WHAT, e);
      return;
    }
    long[] counts = acc.counts;
    counts[0] = plus(counts[0], r.bytesBefore);
    counts[1] = plus(counts[1], r.bytesAfter);
    counts[2] = plus(counts[2], r.dataPackets);
    counts[3] = plus(counts[3], r.retransmissions);
    counts[4] = plus(counts[4], r.queueDelaySamples);
    counts[5] = plus(counts[5], r.queueDelaySumNs);
    acc.flowEvents.addAll(r.flowEvents);
    if (recordFlows.length < r.flowCount) {
      recordFlows = new long[r.flowCount][];
    }
    long[][] stats = recordFlows;
    Arrays.fill(stats, 0, r.flowCount, null);
    int[] flowIndex = r.flowIndex;
    long[] rttNs = r.rttNs;
    for (int i = 0; i < r.sampleCount; i++) {
      int f = flowIndex[i];
      if (f < 0 || f >= r.flowCount) {
        skipped.inc();
        continue;
      }
      long[] s = stats[f];
      if (s == null) {
        s = stats[f] = acc.of(r.flowKey(f));
      }
      long rtt = rttNs[i];
      s[COUNT] += 1;
      s[SUM] = plus(s[SUM], rtt);
      s[MIN] = Math.min(s[MIN], rtt);
    }
  }

  public void merge(Sums acc, Iterable<Sums> others) {
    for (Sums other : others) {
      for (Map.Entry<String, long[]> e : other.byKey.entrySet()) {
        long[] from = e.getValue();
        long[] s = acc.of(e.getKey());
        s[COUNT] += from[COUNT];
        s[SUM] = plus(s[SUM], from[SUM]);
        s[MIN] = Math.min(s[MIN], from[MIN]);
      }
      for (int i = 0; i < COUNTS; i++) {
        acc.counts[i] = plus(acc.counts[i], other.counts[i]);
      }
      acc.flowEvents.addAll(other.flowEvents);
    }
  }

  /** a + b of two non-negative numbers, Long.MAX_VALUE where it would overflow. */
  private static long plus(long a, long b) {
    long sum = a + b;
    return sum < 0 ? Long.MAX_VALUE : sum;
  }

  @Override
  public Row getValue(Sums acc) {
    List<String> keys = new ArrayList<>(acc.byKey.keySet());
    Collections.sort(keys);
    long samples = 0;
    double inverseSum = 0.0;
    Long min = null;
    for (String key : keys) {
      long[] s = acc.byKey.get(key);
      samples += s[COUNT];
      inverseSum += (double) s[COUNT] / s[SUM];
      min = min == null ? s[MIN] : Math.min(min, s[MIN]);
    }
    String[] flowKeys = keys.isEmpty() ? null : keys.toArray(new String[0]);
    Row[] events = acc.flowEvents.isEmpty() ? null : acc.flowEvents.toArray(new Row[0]);
    long[] c = acc.counts;
    return Row.of(
        samples, keys.size(), inverseSum, min, flowKeys, c[0], c[1], c[2], c[3], c[4], c[5],
        events);
  }
}
