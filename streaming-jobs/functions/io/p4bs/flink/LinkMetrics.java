package io.p4bs.flink;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Base64;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
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
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The sequential part of the metrics job: one link's state from window to window, used as an
 * OVER aggregate per link ordered by window time, so Flink keeps the state per link and in its
 * checkpoints, and every window row in gives that window's LinkMetrics row out.
 *
 * <p>Input: one link's window as the job's SQL reduces it (IntervalSummary's RTT per flow, its
 * flows' keys and summed counters, before-tap and after-tap bytes among them, and the window's
 * flow events as rows; NewestLinkSpec's newest LinkSpec record of the links topic, checked, as a
 * row; and whether the specs were all the window had): values, never text to split, so no link id,
 * address or value can be mistaken for a separator. Output: the LinkMetrics
 * fields (streaming-jobs/README.md defines each), whether the link is known (other links' rows
 * are counted in the metric unknown_links and left out), and the SLA alert each bound raises or
 * resolves in this window (state "raise"/"resolve", else null), and whether the window goes into
 * the optimizer feed (OptimizerFeed: every window of a link whose policy needs them all, the
 * windows that can matter of the others; the feed's sink writes those, link_metrics's all).
 *
 * <p>The metrics settings and the config's links come from the job parameter {@value
 * #CONFIG_PARAMETER} (base64 of tab-separated lines, written by
 * p4bs_jobs.metrics.link_metrics_parameter). A link's LinkSpec records, kept in its state, take
 * over from the config's from the window they fall in: the newest sets its capacity, weights and
 * SLA bounds, or removes it (unknown from then on). A window of nothing but specs gives no row.
 * Arithmetic follows the definitions step by step as the tests' reference computation does:
 * the z-score's sums (ChangeDetector) are exactly rounded (Shewchuk's algorithm, as Python's
 * math.fsum) and ns values are rounded half to even.
 *
 * <p>Every number out is finite. A link's settings are checked where they come in
 * (LinkSettings: capacity, d-hat and p-hat above 0, weights finite), so no division is by 0; a
 * window whose values still are not all finite (extreme but valid weights, say) gives no row: it
 * is counted (metric non_finite_link_metrics) and logged with the link and the value, and the
 * link's EWMAs and change detector start afresh from the next window, where a non-finite value
 * would otherwise stay. Consumers see the window missing, as when the job lags.
 */
@FunctionHint(
    input = {
      @DataTypeHint("STRING"),
      @DataTypeHint("TIMESTAMP(3)"),
      @DataTypeHint("TIMESTAMP(3)"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("INT"),
      @DataTypeHint("DOUBLE"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint(IntervalSummary.FLOW_KEYS),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint("BIGINT"),
      @DataTypeHint(IntervalSummary.FLOW_EVENTS),
      @DataTypeHint(LinkSpecReader.SPEC_TYPE),
      @DataTypeHint("BOOLEAN")
    },
    accumulator =
        @DataTypeHint(
            value = "RAW",
            bridgedTo = LinkMetrics.State.class,
            rawSerializer = LinkMetrics.StateSerializer.class),
    output =
        @DataTypeHint(
            "ROW<known BOOLEAN NOT NULL, window_start_ns BIGINT, window_end_ns BIGINT,"
                + " rtt_samples BIGINT, rtt_flows INT, rtt_hmean_ns BIGINT, srtt_ns BIGINT,"
                + " rtt_min_ns BIGINT, long_flows INT, data_packets BIGINT,"
                + " retransmissions BIGINT, loss_rate DOUBLE, loss_rate_ewma DOUBLE,"
                + " queue_delay_samples BIGINT, queue_delay_ns BIGINT,"
                + " queue_delay_ewma_ns BIGINT, throughput_bps BIGINT, utilisation DOUBLE,"
                + " offered_bps BIGINT, offered_utilisation DOUBLE, f DOUBLE, zscore DOUBLE, `change` BOOLEAN,"
                + " delay_alert STRING, delay_alert_id STRING, delay_value DOUBLE,"
                + " delay_bound DOUBLE, loss_alert STRING, loss_alert_id STRING,"
                + " loss_value DOUBLE, loss_bound DOUBLE, feed BOOLEAN>"))
public class LinkMetrics extends AggregateFunction<Row, LinkMetrics.State> {
  private static final long serialVersionUID = 1L;
  public static final String CONFIG_PARAMETER = "p4bs.link-metrics";

  private static final int OUTPUT_FIELDS = 32;
  private static final int DELAY = 0, LOSS = 1;
  private static final String[] KINDS = {"queue_delay", "loss"};

  private static final Logger LOG = LoggerFactory.getLogger(LinkMetrics.class);

  private transient Settings settings;
  private transient OptimizerFeed feed;
  private transient Map<String, LinkSettings> links;
  private transient Counter unknownLinks;
  private transient Counter nonFinite;

  /** The metrics settings (config [metrics]). */
  static final class Settings {
    double srttAlpha, lossAlpha, queueDelayAlpha, zscoreThreshold, zscoreInfluence;
    long rttMinHorizonNs, longFlowTtlNs;
    int zscoreLag, slaWindows;
  }

  /** What a link carries from one window to the next. */
  public static final class State {
    double srtt = Double.NaN, lossEwma = Double.NaN, queueDelayEwma = Double.NaN;
    /** (window end, minimum), the minima increasing from the oldest. */
    final ArrayDeque<long[]> rttMinima = new ArrayDeque<>();
    /** Long flows: flow key -> last sign of life (start event or RTT sample). */
    final HashMap<String, Long> longFlows = new HashMap<>();
    /** The change detector's lag of filtered f values. */
    final ArrayDeque<Double> filteredF = new ArrayDeque<>();
    /** Per SLA bound: consecutive windows outside, inside, and the raised alert's id. */
    final int[] outside = new int[2], inside = new int[2];
    final String[] alertId = new String[2];
    /** The newest LinkSpec so far (null: none; the config's link holds), and its ts_ns. */
    LinkSettings spec;
    boolean removed;
    long specTsNs = Long.MIN_VALUE;
    /** The last window's output, read by getValue right after accumulate; not state. */
    transient Row out;
  }

  /** Writes a state field by field (see FieldSerializer). */
  public static final class StateSerializer extends FieldSerializer<State> {
    private static final long serialVersionUID = 1L;
    static final StateSerializer INSTANCE = new StateSerializer();

    @Override
    public State createInstance() {
      return new State();
    }

    @Override
    public State copy(State from) {
      State to = new State();
      to.srtt = from.srtt;
      to.lossEwma = from.lossEwma;
      to.queueDelayEwma = from.queueDelayEwma;
      for (long[] m : from.rttMinima) {
        to.rttMinima.add(m.clone());
      }
      to.longFlows.putAll(from.longFlows);
      to.filteredF.addAll(from.filteredF);
      for (int k = 0; k < 2; k++) {
        to.outside[k] = from.outside[k];
        to.inside[k] = from.inside[k];
        to.alertId[k] = from.alertId[k];
      }
      to.spec = from.spec; // immutable
      to.removed = from.removed;
      to.specTsNs = from.specTsNs;
      to.out = from.out;
      return to;
    }

    @Override
    public void serialize(State s, DataOutputView target) throws IOException {
      target.writeDouble(s.srtt);
      target.writeDouble(s.lossEwma);
      target.writeDouble(s.queueDelayEwma);
      target.writeInt(s.rttMinima.size());
      for (long[] m : s.rttMinima) {
        target.writeLong(m[0]);
        target.writeLong(m[1]);
      }
      target.writeInt(s.longFlows.size());
      for (Map.Entry<String, Long> e : s.longFlows.entrySet()) {
        target.writeUTF(e.getKey());
        target.writeLong(e.getValue());
      }
      target.writeInt(s.filteredF.size());
      for (double f : s.filteredF) {
        target.writeDouble(f);
      }
      for (int k = 0; k < 2; k++) {
        target.writeInt(s.outside[k]);
        target.writeInt(s.inside[k]);
        target.writeBoolean(s.alertId[k] != null);
        if (s.alertId[k] != null) {
          target.writeUTF(s.alertId[k]);
        }
      }
      target.writeBoolean(s.spec != null);
      if (s.spec != null) {
        s.spec.write(target);
      }
      target.writeBoolean(s.removed);
      target.writeLong(s.specTsNs);
    }

    @Override
    public State deserialize(DataInputView source) throws IOException {
      State s = new State();
      s.srtt = source.readDouble();
      s.lossEwma = source.readDouble();
      s.queueDelayEwma = source.readDouble();
      for (int n = source.readInt(); n > 0; n--) {
        s.rttMinima.add(new long[] {source.readLong(), source.readLong()});
      }
      for (int n = source.readInt(); n > 0; n--) {
        s.longFlows.put(source.readUTF(), source.readLong());
      }
      for (int n = source.readInt(); n > 0; n--) {
        s.filteredF.add(source.readDouble());
      }
      for (int k = 0; k < 2; k++) {
        s.outside[k] = source.readInt();
        s.inside[k] = source.readInt();
        s.alertId[k] = source.readBoolean() ? source.readUTF() : null;
      }
      s.spec = source.readBoolean() ? LinkSettings.read(source) : null;
      s.removed = source.readBoolean();
      s.specTsNs = source.readLong();
      return s;
    }

    @Override
    public TypeSerializerSnapshot<State> snapshotConfiguration() {
      return new StateSerializerSnapshot();
    }
  }

  /** The serializer has no configuration: restoring it is creating it. */
  public static final class StateSerializerSnapshot extends SimpleTypeSerializerSnapshot<State> {
    public StateSerializerSnapshot() {
      super(() -> StateSerializer.INSTANCE);
    }
  }

  @Override
  public void open(FunctionContext context) {
    String encoded = context.getJobParameter(CONFIG_PARAMETER, null);
    if (encoded == null) {
      throw new IllegalStateException(
          "job parameter " + CONFIG_PARAMETER + " (the links and metrics settings) is not set");
    }
    parseConfig(new String(Base64.getDecoder().decode(encoded), StandardCharsets.UTF_8));
    unknownLinks = JobCounters.counter(context, "unknown_links");
    nonFinite = JobCounters.counter(context, "non_finite_link_metrics");
  }

  private void parseConfig(String text) {
    links = new HashMap<>();
    for (String line : text.split("\n")) {
      String[] f = line.split("\t");
      if (f[0].equals("metrics")) {
        settings = new Settings();
        settings.srttAlpha = Double.parseDouble(f[1]);
        settings.lossAlpha = Double.parseDouble(f[2]);
        settings.queueDelayAlpha = Double.parseDouble(f[3]);
        settings.rttMinHorizonNs = Long.parseLong(f[4]);
        settings.longFlowTtlNs = Long.parseLong(f[5]);
        settings.zscoreLag = Integer.parseInt(f[6]);
        settings.zscoreThreshold = Double.parseDouble(f[7]);
        settings.zscoreInfluence = Double.parseDouble(f[8]);
        settings.slaWindows = Integer.parseInt(f[9]);
      } else if (f[0].equals("feed")) {
        feed =
            new OptimizerFeed(
                Double.parseDouble(f[1]),
                Long.parseLong(f[2]),
                f.length > 3 ? Arrays.asList(f[3].split(",")) : List.of());
      } else if (f[0].equals("link")) {
        try {
          links.put(
              f[1],
              LinkSettings.of(
                  Long.parseLong(f[2]),
                  Double.parseDouble(f[3]),
                  Double.parseDouble(f[4]),
                  Double.parseDouble(f[5]),
                  Long.parseLong(f[6]),
                  f[7]));
        } catch (AvroReader.Malformed e) {
          throw new IllegalArgumentException("link " + f[1] + " of the config: " + e.getMessage());
        }
      } else {
        throw new IllegalArgumentException("unknown line in " + CONFIG_PARAMETER + ": " + f[0]);
      }
    }
    if (settings == null || feed == null) {
      throw new IllegalArgumentException(CONFIG_PARAMETER + " has no metrics or feed line");
    }
  }

  @Override
  public State createAccumulator() {
    return new State();
  }

  public void accumulate(
      State s,
      String linkId,
      LocalDateTime windowStart,
      LocalDateTime windowEnd,
      Long rttSamples,
      Integer rttFlows,
      Double rttInverseSum,
      Long rttMinNs,
      String[] rttFlowKeys,
      Long bytes,
      Long afterBytes,
      Long dataPackets,
      Long retransmissions,
      Long queueDelaySamples,
      Long queueDelaySumNs,
      Row[] flowEvents,
      Row linkSpec,
      Boolean specsOnly) {
    if (linkSpec != null) {
      takeSpec(s, linkSpec);
    }
    LinkSettings link = s.removed ? null : s.spec != null ? s.spec : links.get(linkId);
    boolean noData = Boolean.TRUE.equals(specsOnly);
    if (link == null || noData) {
      if (!noData) {
        unknownLinks.inc();
      }
      s.out = noRow();
      return;
    }
    Settings m = settings;
    long start = epochNs(windowStart), end = epochNs(windowEnd);
    // The previous window's values, for the feed: the change detector's history is empty
    // before a link's first window (and after a refused one, which the optimizer missed).
    boolean first = s.filteredF.isEmpty();
    int previousLongFlows = s.longFlows.size();
    Long previousSrtt = Double.isNaN(s.srtt) ? null : roundNs(s.srtt);
    Long previousRttMin = s.rttMinima.isEmpty() ? null : s.rttMinima.peekFirst()[1];

    Double hmean = rttFlows != null && rttFlows > 0 ? rttFlows / rttInverseSum : null;
    if (hmean != null) {
      s.srtt = ewma(s.srtt, hmean, m.srttAlpha);
    }
    if (rttMinNs != null) {
      while (!s.rttMinima.isEmpty() && s.rttMinima.peekLast()[1] >= rttMinNs) {
        s.rttMinima.pollLast(); // a later, smaller minimum outlives it
      }
      s.rttMinima.addLast(new long[] {end, rttMinNs});
    }
    while (!s.rttMinima.isEmpty() && s.rttMinima.peekFirst()[0] <= end - m.rttMinHorizonNs) {
      s.rttMinima.pollFirst();
    }

    countLongFlows(s, flowEvents, rttFlowKeys, end, m.longFlowTtlNs);

    long data = dataPackets, retrans = retransmissions;
    double loss = data != 0 ? (double) retrans / (double) data : 0.0;
    s.lossEwma = ewma(s.lossEwma, loss, m.lossAlpha);
    long qdSamples = queueDelaySamples;
    Double delay = qdSamples != 0 ? (double) queueDelaySumNs / (double) qdSamples : null;
    if (delay != null) {
      s.queueDelayEwma = ewma(s.queueDelayEwma, delay, m.queueDelayAlpha);
    }
    double f =
        -(link.weightLoss * loss / link.maxLoss
            + link.weightDelay * (delay != null ? delay : 0.0) / (double) link.maxQueueDelayNs);
    double[] change =
        ChangeDetector.detect(
            s.filteredF, f, m.zscoreLag, m.zscoreThreshold, m.zscoreInfluence);

    // Utilisation is what the link carried (the after tap); the offered load (the before
    // tap) may exceed the capacity while the queue grows or the router drops.
    double windowS = (end - start) / 1e9;
    double throughput = afterBytes * 8.0 / windowS; // in double: * 8 may overflow a long
    double offered = bytes * 8.0 / windowS;
    double utilisation = throughput / link.capacityBps;
    double offeredUtilisation = offered / link.capacityBps;
    String nonFiniteValue =
        firstNonFinite(
            "rtt_hmean_ns", hmean != null ? hmean : 0.0,
            "srtt_ns", Double.isNaN(s.srtt) ? 0.0 : s.srtt,
            "loss_rate_ewma", s.lossEwma,
            "queue_delay_ns", delay != null ? delay : 0.0,
            "queue_delay_ewma_ns", Double.isNaN(s.queueDelayEwma) ? 0.0 : s.queueDelayEwma,
            "utilisation", utilisation,
            "offered_utilisation", offeredUtilisation,
            "f", f,
            "zscore", change[0]);
    if (nonFiniteValue != null) {
      refuseWindow(s, linkId, end, nonFiniteValue);
      return;
    }
    Long delayNs = delay != null ? roundNs(delay) : null;
    Object[] alerts = new Object[8];
    // A window without queueing-delay samples had nothing queued to measure.
    sla(s, DELAY, delayNs != null ? (double) delayNs : 0.0, (double) link.maxQueueDelayNs,
        linkId, end, m.slaWindows, alerts);
    sla(s, LOSS, loss, link.maxLoss, linkId, end, m.slaWindows, alerts);
    Long srttNs = Double.isNaN(s.srtt) ? null : roundNs(s.srtt);
    Long rttMinOut = s.rttMinima.isEmpty() ? null : s.rttMinima.peekFirst()[1];
    int longFlows = s.longFlows.size();
    boolean changed = change[1] != 0;
    boolean fed =
        !feed.thins(link.policy)
            || feed.passes(
                linkId,
                first,
                previousLongFlows,
                longFlows,
                previousSrtt,
                srttNs,
                previousRttMin,
                rttMinOut,
                changed,
                alerts[0] != null || alerts[4] != null,
                start,
                end);
    s.out =
        Row.of(
            true,
            start,
            end,
            rttSamples,
            rttFlows,
            hmean != null ? roundNs(hmean) : null,
            srttNs,
            rttMinOut,
            longFlows,
            data,
            retrans,
            loss,
            s.lossEwma,
            qdSamples,
            delayNs,
            Double.isNaN(s.queueDelayEwma) ? null : roundNs(s.queueDelayEwma),
            roundNs(throughput),
            utilisation,
            roundNs(offered),
            offeredUtilisation,
            f,
            change[0],
            changed,
            alerts[0],
            alerts[1],
            alerts[2],
            alerts[3],
            alerts[4],
            alerts[5],
            alerts[6],
            alerts[7],
            fed);
  }

  /**
   * The window's newest LinkSpec record (NewestLinkSpec's row, checked there), over the one taken
   * before unless older (as a replay of the compacted topic can bring).
   */
  private static void takeSpec(State s, Row spec) {
    long ts = (Long) spec.getField(0);
    if (ts < s.specTsNs) {
      return;
    }
    s.specTsNs = ts;
    s.removed = (Boolean) spec.getField(1);
    try {
      s.spec =
          LinkSettings.of(
              (Long) spec.getField(2),
              (Double) spec.getField(3),
              (Double) spec.getField(4),
              (Double) spec.getField(5),
              (Long) spec.getField(6),
              (String) spec.getField(7));
    } catch (AvroReader.Malformed e) {
      throw new IllegalStateException("NewestLinkSpec gave a spec it had not checked", e);
    }
  }

  private static Row noRow() {
    Row out = new Row(OUTPUT_FIELDS);
    out.setField(0, false);
    return out;
  }

  /** The name of the first value (name, value pairs) that is not finite; null if all are. */
  private static String firstNonFinite(Object... namesAndValues) {
    for (int i = 0; i < namesAndValues.length; i += 2) {
      double value = (Double) namesAndValues[i + 1];
      if (!Double.isFinite(value)) {
        return namesAndValues[i] + " = " + value;
      }
    }
    return null;
  }

  /**
   * A window with a value that is not finite: no row, counted and logged (the first ten, then
   * every ten-thousandth); the EWMAs that are not finite and the change detector's history start
   * afresh, or every later window of the link would carry the value on.
   */
  private void refuseWindow(State s, String linkId, long end, String why) {
    nonFinite.inc();
    long n = nonFinite.getCount();
    if (n <= 10 || n % 10_000 == 0) {
      LOG.warn("link {}: window ending {} has {}; no row ({} so far)", linkId, end, why, n);
    }
    if (!Double.isFinite(s.srtt)) {
      s.srtt = Double.NaN;
    }
    if (!Double.isFinite(s.lossEwma)) {
      s.lossEwma = Double.NaN;
    }
    if (!Double.isFinite(s.queueDelayEwma)) {
      s.queueDelayEwma = Double.NaN;
    }
    s.filteredF.clear();
    s.out = noRow();
  }

  @Override
  public Row getValue(State s) {
    return s.out;
  }

  /**
   * N: flows enter on their start event and leave on their end event; an RTT sample is a sign of
   * life, and a flow without one for the TTL has lost its end event.
   */
  private static void countLongFlows(
      State s, Row[] flowEvents, String[] rttFlowKeys, long end, long ttlNs) {
    if (flowEvents != null) {
      // In time order; at one time an end before a start, then by flow.
      Row[] events = flowEvents.clone();
      Arrays.sort(
          events,
          Comparator.comparing((Row e) -> (Long) e.getField(0))
              .thenComparing(e -> (Boolean) e.getField(1))
              .thenComparing(e -> (String) e.getField(2)));
      for (Row e : events) {
        String flow = (String) e.getField(2);
        if ((Boolean) e.getField(1)) {
          s.longFlows.putIfAbsent(flow, (Long) e.getField(0));
        } else {
          s.longFlows.remove(flow);
        }
      }
    }
    if (rttFlowKeys != null && !s.longFlows.isEmpty()) {
      for (String key : rttFlowKeys) {
        s.longFlows.replace(key, end);
      }
    }
    long expired = end - ttlNs;
    Iterator<Long> seen = s.longFlows.values().iterator();
    while (seen.hasNext()) {
      if (seen.next() < expired) {
        seen.remove();
      }
    }
  }

  /** A bound broken for K consecutive windows raises an alert, K windows within resolve it. */
  private static void sla(
      State s,
      int kind,
      double value,
      double bound,
      String linkId,
      long end,
      int k,
      Object[] alerts) {
    if (value > bound) {
      s.outside[kind]++;
      s.inside[kind] = 0;
    } else {
      s.outside[kind] = 0;
      s.inside[kind]++;
    }
    String state;
    String id = s.alertId[kind];
    if (id == null && s.outside[kind] == k) {
      id = s.alertId[kind] = linkId + "/" + KINDS[kind] + "/" + end;
      state = "raise";
    } else if (id != null && s.inside[kind] == k) {
      s.alertId[kind] = null;
      state = "resolve";
    } else {
      return;
    }
    int at = kind * 4;
    alerts[at] = state;
    alerts[at + 1] = id;
    alerts[at + 2] = value;
    alerts[at + 3] = bound;
  }

  private static double ewma(double previous, double sample, double alpha) {
    return Double.isNaN(previous) ? sample : alpha * previous + (1 - alpha) * sample;
  }

  /** Rounded half to even, as the reference computation (Python's round) does. */
  private static long roundNs(double value) {
    return (long) Math.rint(value);
  }

  private static long epochNs(LocalDateTime moment) {
    return moment.toEpochSecond(ZoneOffset.UTC) * 1_000_000_000L + moment.getNano();
  }
}
