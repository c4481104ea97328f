"""Images and audio in a request: media parts → markers → projector input, fetching
(``data:``, ``http(s)``, ``file:``), URL and address checks, format sniffing."""
