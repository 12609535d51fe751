package io.p4bs.flink;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.flink.types.Row;

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
 * type's range, sample columns of different lengths, a negative count or RTT, a flow event
 * neither start nor end, an address that is not an IP address's text) is a {@link Malformed}
 * with what was wrong. The addresses are checked because they become the flow keys the job
 * keeps in its state: a key of any bytes could be megabytes long. One reader per function
 * instance; not thread-safe.
 */
final class IntervalReader extends AvroReader {
  /** The metric that counts dropped records, in every function that reads them. */
  static final String MALFORMED_METRIC = "malformed_link_counters";

  static final String WHAT = "link counters record";
  /** The longest text of an IP address (IPv6 with an IPv4 tail). */
  private static final int ADDRESS_MAX = 45;
  private static final int SRC_START = 0, SRC_LENGTH = 1, DST_START = 2, DST_LENGTH = 3;
  private static final int SRC_PORT = 4, DST_PORT = 5, PROTOCOL = 6, FLOW_INTS = 7;

  long tsNs;
  long bytesBefore;
  long bytesAfter;
  long dataPackets;
  long retransmissions;
  long queueDelaySamples;
  long queueDelaySumNs;
  /**
   * The flow events as IntervalSummary outputs them: ROW(ts_ns, started, flow key), started true
   * for a start event, false for an end (the list is the reader's: it holds the last record's).
   */
  final List<Row> flowEvents = new ArrayList<>();

  int flowCount;
  int sampleCount;
  /** Per flow, FLOW_INTS ints: where its addresses are in the value, its ports and protocol. */
  private int[] flows = new int[FLOW_INTS * 16];

  int[] flowIndex = new int[256];
  long[] rttNs = new long[256];

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
    end();
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

  private void readHeader() throws Malformed {
    readStringLength(); // link_id: the Kafka key carries it too
    tsNs = readLong();
    long intervalNs = readLong();
    if (tsNs <= 0 || intervalNs <= 0) {
      throw new Malformed("ts_ns " + tsNs + " and interval_ns " + intervalNs + " must be > 0");
    }
  }

  private void readCountsAndEvents() throws Malformed {
    readCount("seq");
    readCount("packets");
    bytesBefore = readCount("bytes");
    readCount("after_packets");
    bytesAfter = readCount("after_bytes");
    dataPackets = readCount("data_packets");
    readCount("data_bytes");
    retransmissions = readCount("retransmissions");
    queueDelaySamples = readCount("queue_delay_samples");
    queueDelaySumNs = readCount("queue_delay_sum_ns");
    readLong(); // queue_delay_ewma_ns: the job keeps its own EWMA
    readInt(); // part: the parts of an interval add up, in whichever window order
    readBoolean("complete");
    flowEvents.clear();
    for (long n = blockCount(9); n > 0; n = blockCount(9)) {
      for (; n > 0; n--) {
        long ts = readLong();
        String kind = readString();
        if (!kind.equals("start") && !kind.equals("end")) {
          throw new Malformed("a flow event of kind '" + kind + "', neither start nor end");
        }
        readStringLength(); // reason
        String src = readAddress();
        String dst = readAddress();
        int srcPort = readInt();
        int dstPort = readInt();
        String key = flowKey(src, srcPort, dst, dstPort, readInt());
        readLong(); // packets
        flowEvents.add(Row.of(ts, kind.equals("start"), key));
      }
    }
  }

  private long readCount(String field) throws Malformed {
    long count = readLong();
    if (count < 0) {
      throw new Malformed(field + " = " + count + " is negative");
    }
    return count;
  }

  /** An address's text, checked: 1 to 45 of the characters an IPv4 or IPv6 address has. */
  private String readAddress() throws Malformed {
    int length = readStringLength();
    checkAddress(pos - length, length);
    return text(pos - length, length);
  }

  private void checkAddress(int start, int length) throws Malformed {
    if (length == 0 || length > ADDRESS_MAX) {
      throw new Malformed("an address of " + length + " bytes at byte " + start);
    }
    for (int i = start; i < start + length; i++) {
      int c = bytes[i];
      boolean hex = c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F';
      if (!hex && c != '.' && c != ':') {
        throw new Malformed("an address that is not an IP address's: '" + text(start, length) + "'");
      }
    }
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
        checkAddress(flows[at + SRC_START], flows[at + SRC_LENGTH]);
        flows[at + DST_LENGTH] = readStringLength();
        flows[at + DST_START] = pos - flows[at + DST_LENGTH];
        checkAddress(flows[at + DST_START], flows[at + DST_LENGTH]);
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
    long signs = 0; // negative if a sample is
    for (long n = blockCount(1); n > 0; n = blockCount(1)) {
      if (count + n > rttNs.length) {
        rttNs = Arrays.copyOf(rttNs, (int) Math.max(2L * rttNs.length, count + n));
      }
      for (; n > 0; n--) {
        long rtt = readLong();
        signs |= rtt;
        rttNs[count++] = rtt;
      }
    }
    if (signs < 0) {
      throw new Malformed("a negative RTT sample");
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
}
