// An HDFS for tests: Hadoop's MiniDFSCluster (a NameNode and one DataNode in this JVM).
// Run by tests/support/mini_hdfs.py as a single-file program on .jars/hdfs-minicluster:
//   java -cp ".jars/hdfs-minicluster/*" tests/support/MiniHdfs.java <base dir> <port or 0>
// Prints "READY hdfs://127.0.0.1:<port>" once a file has been written and read back through
// the DataNode, then serves until its standard input closes.
import java.nio.charset.StandardCharsets;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
  public static void main(String[] args) throws Exception {
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, args[0]);
    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf)
            .nameNodePort(Integer.parseInt(args[1]))
            .numDataNodes(1)
            .format(true)
            .build();
    cluster.waitActive();
    FileSystem fs = cluster.getFileSystem();
    Path probe = new Path("/.ready");
    try (FSDataOutputStream out = fs.create(probe, true)) {
      out.write("ok".getBytes(StandardCharsets.UTF_8));
    }
    if (fs.getFileStatus(probe).getLen() != 2) {
      throw new IllegalStateException("the probe file did not round-trip");
    }
    fs.delete(probe, false);
    System.out.println("READY hdfs://127.0.0.1:" + cluster.getNameNodePort());
    System.out.flush();
    while (System.in.read() != -1) {
      // serve until the test closes our standard input
    }
    cluster.shutdown();
  }
}
