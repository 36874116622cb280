// The SQL append from Java (JDBC): run by test/writers (writers_test.go) as a single source file
// (java -cp postgresql.jar Append.java), which checks with an independent consumer that the events
// reach Kafka in commit order per aggregate.
//
//   java -cp postgresql.jar Append.java WRITER AGGREGATES TRANSACTIONS   (URL in OUTBOX_DATABASE_URL)
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;

public class Append {
    public static void main(String[] args) throws Exception {
        String writer = args[0];
        int aggregates = Integer.parseInt(args[1]), transactions = Integer.parseInt(args[2]);
        URI u = URI.create(System.getenv("OUTBOX_DATABASE_URL"));
        String[] user = u.getRawUserInfo().split(":", 2);
        String jdbc = "jdbc:postgresql://" + u.getHost() + ":" + u.getPort() + u.getPath();
        String password = user.length > 1 ? URLDecoder.decode(user[1], StandardCharsets.UTF_8) : "";
        try (Connection conn = DriverManager.getConnection(jdbc, URLDecoder.decode(user[0], StandardCharsets.UTF_8), password)) {
            conn.setAutoCommit(false);
            PreparedStatement append = conn.prepareStatement("SELECT outbox_append(?, ?, ?, ?::jsonb)");
            PreparedStatement record = conn.prepareStatement(
                "WITH c AS (UPDATE counters SET n = n + 1 WHERE aggregate_id = ? RETURNING n) INSERT INTO commit_seq SELECT ?::uuid, ?, n FROM c");
            for (int i = 0; i < transactions; i++) {
                String agg = "agg-" + (i % aggregates);
                // The append: one statement, the aggregate's lock taken before the id is drawn.
                append.setString(1, "order");
                append.setString(2, agg);
                append.setString(3, "OrderPlaced");
                append.setString(4, "{\"writer\": \"" + writer + "\", \"i\": " + i + "}");
                String eventId;
                try (ResultSet rs = append.executeQuery()) {
                    rs.next();
                    eventId = rs.getString(1);
                }
                // The test's record of commit order (the counter's row lock orders the commits).
                if (i % 3 == 0) {
                    conn.createStatement().execute("SELECT pg_sleep(0.001)");
                }
                record.setString(1, agg);
                record.setString(2, eventId);
                record.setString(3, agg);
                record.executeUpdate();
                conn.commit();
            }
        }
    }
}
