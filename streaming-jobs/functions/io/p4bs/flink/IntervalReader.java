package io.p4bs.flink;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.flink.metrics.Counter;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads a link interval's record, LinkCounters v3 Avro binary (schemas/p4bs_schemas/avro/
 * LinkCounters.avsc, the current version, as the p4bs codec and the exporters write it), straight
 * from the Kafka value's bytes into fields and reused primitive arrays. Flink's avro format
 * builds a generic record, boxes every RTT sample and copies it into a row: a quarter of the
 * metrics job's time in a profile when the samples had a stream of their own.
 *
 * <p>Field order: link_id (string), ts_ns, interval_ns, seq (long), ten counts (long), part
 * (int), complete (boolean), flow_events (array of {ts_ns: long; kind, reason, src_ip, dst_ip:
 * string; src_port, dst_port, protocol: int; packets: long}), flows (array of {src_ip, dst_ip:
 * string; src_port, dst_port, protocol: int}), flow_index (array of int), offset_ns, rtt_ns
 * (arrays of long). Three depths of reading, each decoding no more than it needs: {@link
 * #readEnd} the header, {@link #readCounts} up to the flow events, {@link #read} all of it.
 * Anything else (a truncated value, a length past its end, bytes left over, a number out of its
 * type's range, sample columns of different lengths) is a {@link Malformed} with what was wrong.
 * One reader per function instance; not thread-safe.
 */
final class IntervalReader {
  /** A value that is not a LinkCounters record; the message says why. */
  static final class Malformed extends Exception {
    private static final long serialVersionUID = 1L;

    Malformed(String why) {
      super(why, null, false, false); // no stack trace: bad records are counted, not debugged
    }
  }

  /** The metric that counts dropped records, in every function that reads them. */
  static final String MALFORMED_METRIC = "malformed_link_counters";

  private static final Logger LOG = LoggerFactory.getLogger(IntervalReader.class);
  private static final int SRC_START = 0, SRC_LENGTH = 1, DST_START = 2, DST_LENGTH = 3;
  private static final int SRC_PORT = 4, DST_PORT = 5, PROTOCOL = 6, FLOW_INTS = 7;

  private byte[] bytes = new byte[0];
  private int pos;

  long tsNs;
  long bytesBefore;
  long bytesAfter;
  long dataPackets;
  long retransmissions;
  long queueDelaySamples;
  long queueDelaySumNs;
  /** The flow events as the metrics job's text: "ts_ns kind flow", comma separated; or null. */
  String flowEvents;

  int flowCount;
  int sampleCount;
  /** Per flow, FLOW_INTS ints: where its addresses are in the value, its ports and protocol. */
  private int[] flows = new int[FLOW_INTS * 16];

  int[] flowIndex = new int[256];
  long[] rttNs = new long[256];

  /**
   * Counts a dropped record and logs why: the first ten, then every ten-thousandth (a stream of
   * garbage must not flood the log).
   */
  static void count(Counter dropped, Malformed why) {
    dropped.inc();
    long n = dropped.getCount();
    if (n <= 10 || n % 10_000 == 0) {
      LOG.warn("link counters record dropped ({} so far): {}", n, why.getMessage());
    }
  }

  /** The interval's end (ts_ns) of a value, reading only its first fields. */
  long readEnd(byte[] value) throws Malformed {
    start(value);
    readHeader();
    return tsNs;
  }

  /** Reads a value up to its flow events: the counts the job sums, and the events. */
  void readCounts(byte[] value) throws Malformed {
    start(value);
    readHeader();
    readCountsAndEvents();
  }

  /**
   * Reads a whole value; its RTT samples are then in flowIndex and rttNs [0, sampleCount), their
   * flows' keys from {@link #flowKey}.
   */
  void read(byte[] value) throws Malformed {
    readCounts(value);
    readFlows();
    int indexes = readIntArray();
    skipLongArray(); // offset_ns: windows hold whole export intervals, so it is not needed
    sampleCount = readRttArray();
    if (pos != bytes.length) {
      throw new Malformed((bytes.length - pos) + " bytes after the last field");
    }
    if (indexes != sampleCount) {
      throw new Malformed(indexes + " flow indexes for " + sampleCount + " RTTs");
    }
  }

  /** Flow {@code f}'s key, "src:sport>dst:dport/protocol", as the job names flows. */
  String flowKey(int f) {
    int at = f * FLOW_INTS;
    return flowKey(
        text(flows[at + SRC_START], flows[at + SRC_LENGTH]),
        flows[at + SRC_PORT],
        text(flows[at + DST_START], flows[at + DST_LENGTH]),
        flows[at + DST_PORT],
        flows[at + PROTOCOL]);
  }

  private static String flowKey(String src, int srcPort, String dst, int dstPort, int protocol) {
    return src + ":" + srcPort + ">" + dst + ":" + dstPort + "/" + protocol;
  }

  private void start(byte[] value) throws Malformed {
    if (value == null) {
      throw new Malformed("no value");
    }
    bytes = value;
    pos = 0;
  }

  private void readHeader() throws Malformed {
    readStringLength(); // link_id: the Kafka key carries it too
    tsNs = readLong();
    long intervalNs = readLong();
    if (tsNs <= 0 || intervalNs <= 0) {
      throw new Malformed("ts_ns " + tsNs + " and interval_ns " + intervalNs + " must be > 0");
    }
  }

  private void readCountsAndEvents() throws Malformed {
    readLong(); // seq
    readLong(); // packets
    bytesBefore = readLong();
    readLong(); // after_packets
    bytesAfter = readLong();
    dataPackets = readLong();
    readLong(); // data_bytes
    retransmissions = readLong();
    queueDelaySamples = readLong();
    queueDelaySumNs = readLong();
    readLong(); // queue_delay_ewma_ns: the job keeps its own EWMA
    readInt(); // part: the parts of an interval add up, in whichever window order
    if (pos >= bytes.length || (bytes[pos] & 0xFF) > 1) {
      throw new Malformed("complete is not a boolean at byte " + pos);
    }
    pos++;
    StringBuilder events = null;
    for (long n = blockCount(9); n > 0; n = blockCount(9)) {
      for (; n > 0; n--) {
        long ts = readLong();
        String kind = readString();
        readStringLength(); // reason
        String src = readString();
        String dst = readString();
        int srcPort = readInt();
        int dstPort = readInt();
        String key = flowKey(src, srcPort, dst, dstPort, readInt());
        readLong(); // packets
        events = events == null ? new StringBuilder() : events.append(',');
        events.append(ts).append(' ').append(kind).append(' ').append(key);
      }
    }
    flowEvents = events == null ? null : events.toString();
  }

  private void readFlows() throws Malformed {
    flowCount = 0;
    for (long n = blockCount(5); n > 0; n = blockCount(5)) {
      for (; n > 0; n--) {
        if ((flowCount + 1) * FLOW_INTS > flows.length) {
          flows = Arrays.copyOf(flows, flows.length * 2);
        }
        int at = flowCount++ * FLOW_INTS;
        flows[at + SRC_LENGTH] = readStringLength();
        flows[at + SRC_START] = pos - flows[at + SRC_LENGTH];
        flows[at + DST_LENGTH] = readStringLength();
        flows[at + DST_START] = pos - flows[at + DST_LENGTH];
        flows[at + SRC_PORT] = readInt();
        flows[at + DST_PORT] = readInt();
        flows[at + PROTOCOL] = readInt();
      }
    }
  }

  private int readIntArray() throws Malformed {
    int count = 0;
    for (long n = blockCount(1); n > 0; n = blockCount(1)) {
      if (count + n > flowIndex.length) {
        flowIndex = Arrays.copyOf(flowIndex, (int) Math.max(2L * flowIndex.length, count + n));
      }
      for (; n > 0; n--) {
        flowIndex[count++] = readInt();
      }
    }
    return count;
  }

  private int readRttArray() throws Malformed {
    int count = 0;
    for (long n = blockCount(1); n > 0; n = blockCount(1)) {
      if (count + n > rttNs.length) {
        rttNs = Arrays.copyOf(rttNs, (int) Math.max(2L * rttNs.length, count + n));
      }
      for (; n > 0; n--) {
        rttNs[count++] = readLong();
      }
    }
    return count;
  }

  private void skipLongArray() throws Malformed {
    for (long n = blockCount(1); n > 0; n = blockCount(1)) {
      for (; n > 0; n--) {
        readLong();
      }
    }
  }

  /**
   * The item count of an array's next block (0 at its end). A negative count is followed by the
   * block's size in bytes (Avro's skippable blocks). Each item takes at least {@code minItemBytes},
   * so a count the rest of the value cannot hold is malformed rather than a huge allocation.
   */
  private long blockCount(int minItemBytes) throws Malformed {
    long n = readLong();
    if (n < 0) {
      n = -n;
      readLong();
    }
    if (n > (long) (bytes.length - pos) / minItemBytes) {
      throw new Malformed(
          "an array block of " + n + " items at byte " + pos + " of " + bytes.length);
    }
    return n;
  }

  private long readLong() throws Malformed {
    long z = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= bytes.length) {
        throw new Malformed("value ends inside a number at byte " + pos);
      }
      byte b = bytes[pos++];
      z |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        return (z >>> 1) ^ -(z & 1);
      }
    }
    throw new Malformed("a number longer than 10 bytes at byte " + pos);
  }

  private int readInt() throws Malformed {
    long v = readLong();
    if (v != (int) v) {
      throw new Malformed("int out of range: " + v);
    }
    return (int) v;
  }

  /** Skips a string and returns its length in bytes. */
  private int readStringLength() throws Malformed {
    long n = readLong();
    if (n < 0 || n > bytes.length - pos) {
      throw new Malformed("a string of " + n + " bytes at byte " + pos + " of " + bytes.length);
    }
    pos += (int) n;
    return (int) n;
  }

  private String readString() throws Malformed {
    int length = readStringLength();
    return text(pos - length, length);
  }

  private String text(int start, int length) {
    return new String(bytes, start, length, StandardCharsets.UTF_8);
  }
}
